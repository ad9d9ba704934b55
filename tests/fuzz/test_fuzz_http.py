"""Fuzzing the coordinator's HTTP API with schemathesis (the ``st`` command, run against a
real coordinator's /openapi.json): every generated request, valid or not, must be
answered without a 500 and within the request timeout.

Also a hand-written hypothesis fuzz of the lease endpoints' JSON bodies (any JSON value,
any field types), which schemathesis' schema-following generator reaches less often.
Example counts: ``PIDLEASE_FUZZ_EXAMPLES`` (default 300; schemathesis' ``-n`` is per
operation, so its total is that times the operations and phases).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pidlease.testing.devcluster import LocalCluster

EXAMPLES = int(os.environ.get("PIDLEASE_FUZZ_EXAMPLES", "300"))
SCHEMATHESIS_EXAMPLES = max(10, EXAMPLES // 6)
REQUEST_TIMEOUT_S = 30.0
COUNTS: dict[str, int] = {}
ST = shutil.which("st", path=str(Path(sys.executable).parent))


@pytest.fixture(scope="module")
def coordinator(make_module_cluster: Any) -> Iterator[LocalCluster]:
    cluster: LocalCluster = make_module_cluster(servers=1, coordinators=1)
    try:
        cluster.create_topic("orders", partitions=2)
        yield cluster
    finally:
        print(f"FUZZ HTTP COUNTS: {COUNTS}")
        logs = "".join(s.log_path.read_text(errors="replace") for s in cluster.coordinators)
        print(f"coordinator log tracebacks: {logs.count('Traceback')}")


@pytest.mark.slow
@pytest.mark.skipif(ST is None, reason="schemathesis is not installed (pip install schemathesis)")
def test_schemathesis_finds_no_server_error(coordinator: LocalCluster, tmp_path: Path) -> None:
    report = tmp_path / "st.ndjson"
    cmd = [
        str(ST),
        "run",
        coordinator.coordinator_url + "/openapi.json",
        "--checks",
        "not_a_server_error",
        "-n",
        str(SCHEMATHESIS_EXAMPLES),
        "--request-timeout",
        str(REQUEST_TIMEOUT_S),
        "--seed",
        "6",
        "--report",
        "ndjson",
        "--report-ndjson-path",
        str(report),
        "--no-color",
    ]
    out = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "SCHEMATHESIS_HOOKS": ""},
    )
    print(out.stdout[-3000:])
    m = re.search(r"Test cases:\s*\n?\s*(\d+) generated", out.stdout)
    COUNTS["schemathesis_cases"] = int(m.group(1)) if m else -1
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=12,
)
lease_fields = st.fixed_dictionaries(
    {},
    optional={
        "topic": json_values | st.sampled_from(["orders", "nope", ""]),
        "partition": json_values | st.integers(-2, 3),
        "pid": json_values | st.integers(-2, 2**64),
        "generation": json_values | st.integers(-1, 2**32),
        "expire_ms": json_values | st.integers(-1, 2**40),
        "producer_name": json_values,
    },
)
bodies = st.one_of(
    json_values,
    lease_fields,
    st.fixed_dictionaries({"requests": st.lists(lease_fields, max_size=5)}),
)
paths = st.sampled_from(["/v1/lease_pid", "/v1/lease_pid/batch", "/v1/topics"])


@pytest.mark.slow
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(path=paths, body=bodies, raw=st.booleans(), junk=st.binary(max_size=64))
def test_json_bodies_never_get_a_500(
    coordinator: LocalCluster, path: str, body: object, raw: bool, junk: bytes
) -> None:
    COUNTS["json"] = COUNTS.get("json", 0) + 1
    content = junk if raw else json.dumps(body).encode()
    r = httpx.post(
        coordinator.coordinator_url + path,
        content=content,
        timeout=REQUEST_TIMEOUT_S,
        headers={"content-type": "application/json"},
    )
    assert r.status_code < 500 or r.json().get("error") == "COORDINATOR_UNAVAILABLE", (
        r.status_code,
        r.text,
    )
    assert "error" in r.json(), r.text
