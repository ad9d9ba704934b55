"""docs/kafka.md's tables kept true (issue 25 item 6): the API table is what the listener
advertises (``codec.SUPPORTED``), and the clients x features matrix names, for every
"yes" or "partly", tests that exist and use that client, and its columns agree with the
APIs advertised (a feature no client has advertises none of its APIs; one that a client
has advertises all of them)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from partition_server.kafka import codec as C

ROOT = Path(__file__).resolve().parents[3]
DOC = (ROOT / "docs" / "kafka.md").read_text()
COLUMNS = ["produce", "failover", "assign", "groups", "admin", "compression", "transactions"]
# What shows a test uses a client (in its module).
MARKERS = {
    "confluent-kafka": ("confluent_kafka",),
    "aiokafka": ("aiokafka",),
    "kcat": ("kcat",),
    "kafkajs": ("kafkajs",),
    "pidlease SDK": ("pidlease.client", "import cli"),
}
# The Kafka APIs each feature needs (AddPartitionsToTxn, AddOffsetsToTxn, EndTxn,
# TxnOffsetCommit for transactions).
APIS = {
    "produce": {0, 22},
    "assign": {1, 2, 3},
    "groups": {8, 9, 10, 11, 12, 13, 14},
    "admin": {19, 20, 32, 37, 44},
    "transactions": {24, 25, 26, 28},
}
REF = re.compile(r"([\w/]+\.py)::(\w+)")


def table_after(heading: str) -> list[list[str]]:
    at = DOC.index(heading)
    rows: list[list[str]] = []
    for line in DOC[at:].splitlines()[1:]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
        elif rows:
            break
    return rows


def matrix() -> tuple[list[str], list[list[str]]]:
    rows = table_after("### Clients x features")
    return rows[0], rows[2:]


def client_of(cell: str) -> str:
    for name in MARKERS:
        if cell.startswith(name):
            return name
    raise AssertionError(f"a client the test does not know: {cell!r} (add it to MARKERS)")


def test_the_matrix_has_the_issue_columns_and_known_values() -> None:
    head, rows = matrix()
    assert head == ["client", *COLUMNS]
    assert {client_of(r[0]) for r in rows} == set(MARKERS)
    for r in rows:
        assert len(r) == len(head), r[0]
        for col, cell in zip(COLUMNS, r[1:], strict=True):
            kind, _, rest = cell.partition(":")
            assert kind in ("yes", "partly", "no", "untested"), (r[0], col, cell)
            assert len(rest.strip()) > 10, f"{r[0]} / {col}: say which tests, or what users see"
            if kind in ("yes", "partly"):
                assert REF.search(rest), f"{r[0]} / {col}: {kind} without a test"


def _defs(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


def test_every_test_the_matrix_names_exists_and_uses_that_client() -> None:
    _, rows = matrix()
    seen = 0
    for r in rows:
        client = client_of(r[0])
        for col, cell in zip(COLUMNS, r[1:], strict=True):
            for file, name in REF.findall(cell):
                path = ROOT / "tests" / file
                assert path.is_file(), f"{client} / {col}: no tests/{file}"
                assert name.startswith("test_") and name in _defs(path), (
                    f"{client} / {col}: no {name} in tests/{file}"
                )
                src = path.read_text()
                assert any(m in src for m in MARKERS[client]), (
                    f"{client} / {col}: tests/{file} does not use {client}"
                )
                seen += 1
    assert seen >= 20


@pytest.mark.parametrize("col", sorted(APIS))
def test_a_column_agrees_with_the_apis_advertised(col: str) -> None:
    _, rows = matrix()
    kinds = {r[1 + COLUMNS.index(col)].partition(":")[0] for r in rows}
    advertised = APIS[col] & set(C.SUPPORTED)
    if kinds & {"yes", "partly"}:
        assert advertised == APIS[col], f"{col}: a client has it, APIs missing"
    else:
        assert not advertised, f"{col}: no client has it, yet {sorted(advertised)} advertised"


def test_the_api_table_is_what_apiversions_answers() -> None:
    documented: dict[int, tuple[int, int]] = {}
    for r in table_after("APIs and versions advertised")[2:]:
        m = re.fullmatch(r"[\w ]+ \((\d+)\)", r[0])
        v = re.fullmatch(r"(\d+)(?:-(\d+))?", r[1])
        assert m and v, r
        lo = int(v.group(1))
        documented[int(m.group(1))] = (lo, int(v.group(2) or lo))
    assert documented == C.SUPPORTED
