"""Malformed and refused requests against a real coordinator process: each gets a 4xx
with the right error code and a sentence, none is a 500, nothing is changed, and the
service keeps serving afterwards (a good lease works, no unexpected error was logged)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from pidlease.testing.devcluster import LocalCluster, http_json

TEN_MB = 10 * 1024 * 1024
L = {"topic": "orders", "partition": 0, "pid": -1}


@pytest.fixture(scope="module")
def cluster(make_module_cluster: Any) -> LocalCluster:
    c: LocalCluster = make_module_cluster(servers=1)
    c.create_topic("orders", 2)
    return c


@pytest.fixture(scope="module")
def named(cluster: LocalCluster) -> dict[str, Any]:
    """A PID taken over once, so its first generation is stale."""
    _, first = http_json(
        "POST", cluster.coordinator_url + "/v1/lease_pid", {**L, "producer_name": "m"}
    )
    _, second = http_json(
        "POST", cluster.coordinator_url + "/v1/lease_pid", {**L, "producer_name": "m"}
    )
    return {"pid": first["pid"], "stale": first["generation"], "current": second["generation"]}


STREAMED_10MB = object()  # a 10 MB body sent chunked, without content-length


def _chunks() -> Iterator[bytes]:
    for _ in range(160):
        yield b" " * 65536


CASES: list[tuple[str, str, str, Any, int, str]] = [
    # id, method, path, body (json unless bytes / callable), status, error
    ("partition-str", "POST", "/v1/lease_pid", {**L, "partition": "5"}, 422, "INVALID_REQUEST"),
    ("partition-bool", "POST", "/v1/lease_pid", {**L, "partition": True}, 422, "INVALID_REQUEST"),
    ("partition-float", "POST", "/v1/lease_pid", {**L, "partition": 1.5}, 422, "INVALID_REQUEST"),
    ("partition-negative", "POST", "/v1/lease_pid", {**L, "partition": -1}, 422, "INVALID_REQUEST"),
    ("partition-2**31", "POST", "/v1/lease_pid", {**L, "partition": 2**31}, 422, "INVALID_REQUEST"),
    ("pid-0", "POST", "/v1/lease_pid", {**L, "pid": 0}, 422, "INVALID_REQUEST"),
    ("pid-negative", "POST", "/v1/lease_pid", {**L, "pid": -7}, 422, "INVALID_REQUEST"),
    ("pid-2**63", "POST", "/v1/lease_pid", {**L, "pid": 2**63}, 422, "INVALID_REQUEST"),
    ("pid-overflow-64", "POST", "/v1/lease_pid", {**L, "pid": 2**64 + 1}, 422, "INVALID_REQUEST"),
    (
        "pid-missing",
        "POST",
        "/v1/lease_pid",
        {"topic": "orders", "partition": 0},
        422,
        "INVALID_REQUEST",
    ),
    (
        "generation-negative",
        "POST",
        "/v1/lease_pid",
        {**L, "pid": 5, "generation": -1},
        422,
        "INVALID_REQUEST",
    ),
    (
        "generation-2**31",
        "POST",
        "/v1/lease_pid",
        {**L, "pid": 5, "generation": 2**31},
        422,
        "INVALID_REQUEST",
    ),
    (
        "generation-with-new-pid",
        "POST",
        "/v1/lease_pid",
        {**L, "generation": 3},
        422,
        "INVALID_REQUEST",
    ),
    ("expire-0", "POST", "/v1/lease_pid", {**L, "expire_ms": 0}, 422, "INVALID_REQUEST"),
    ("expire-overflow", "POST", "/v1/lease_pid", {**L, "expire_ms": 2**63}, 422, "INVALID_REQUEST"),
    ("expire-str", "POST", "/v1/lease_pid", {**L, "expire_ms": "60000"}, 422, "INVALID_REQUEST"),
    ("name-empty", "POST", "/v1/lease_pid", {**L, "producer_name": ""}, 422, "INVALID_REQUEST"),
    (
        "name-256",
        "POST",
        "/v1/lease_pid",
        {**L, "producer_name": "n" * 256},
        422,
        "INVALID_REQUEST",
    ),
    ("name-int", "POST", "/v1/lease_pid", {**L, "producer_name": 5}, 422, "INVALID_REQUEST"),
    ("topic-missing", "POST", "/v1/lease_pid", {"partition": 0, "pid": -1}, 422, "INVALID_REQUEST"),
    ("topic-int", "POST", "/v1/lease_pid", {**L, "topic": 7}, 422, "INVALID_REQUEST"),
    ("topic-slash", "POST", "/v1/lease_pid", {**L, "topic": "a/../b"}, 422, "INVALID_REQUEST"),
    ("unknown-field", "POST", "/v1/lease_pid", {**L, "surprise": 1}, 422, "INVALID_REQUEST"),
    ("body-list", "POST", "/v1/lease_pid", [L], 422, "INVALID_REQUEST"),
    ("body-null", "POST", "/v1/lease_pid", None, 422, "INVALID_REQUEST"),
    ("not-json", "POST", "/v1/lease_pid", b'{"topic": "orders",', 400, "INVALID_REQUEST"),
    ("ten-mb", "POST", "/v1/lease_pid", b"x" * TEN_MB, 413, "INVALID_REQUEST"),
    ("ten-mb-streamed", "POST", "/v1/lease_pid", STREAMED_10MB, 413, "INVALID_REQUEST"),
    (
        "unknown-topic",
        "POST",
        "/v1/lease_pid",
        {**L, "topic": "nope"},
        404,
        "UNKNOWN_TOPIC_OR_PARTITION",
    ),
    (
        "partition-past-end",
        "POST",
        "/v1/lease_pid",
        {**L, "partition": 2},
        404,
        "UNKNOWN_TOPIC_OR_PARTITION",
    ),
    (
        "unknown-pid",
        "POST",
        "/v1/lease_pid",
        {**L, "pid": 10**15, "generation": 1},
        404,
        "UNKNOWN_PID",
    ),
    (
        "stale-generation",
        "POST",
        "/v1/lease_pid",
        lambda n: {**L, "pid": n["pid"], "generation": n["stale"]},
        409,
        "FENCED",
    ),
    (
        "never-issued-generation",
        "POST",
        "/v1/lease_pid",
        lambda n: {**L, "pid": n["pid"], "generation": n["current"] + 1},
        400,
        "INVALID_REQUEST",
    ),
    (
        "name-of-other-pid",
        "POST",
        "/v1/lease_pid",
        lambda n: {**L, "pid": n["pid"], "producer_name": "other"},
        400,
        "INVALID_REQUEST",
    ),
    ("batch-empty-object", "POST", "/v1/lease_pid/batch", {}, 422, "INVALID_REQUEST"),
    ("batch-no-requests", "POST", "/v1/lease_pid/batch", {"requests": []}, 422, "INVALID_REQUEST"),
    ("batch-not-list", "POST", "/v1/lease_pid/batch", {"requests": "all"}, 422, "INVALID_REQUEST"),
    (
        "batch-bad-item",
        "POST",
        "/v1/lease_pid/batch",
        {"requests": [L, {**L, "pid": 0}]},
        422,
        "INVALID_REQUEST",
    ),
    (
        "batch-too-many",
        "POST",
        "/v1/lease_pid/batch",
        {"requests": [L] * 1001},
        400,
        "INVALID_REQUEST",
    ),
    ("topic-no-partitions", "POST", "/v1/topics", {"name": "x"}, 422, "INVALID_REQUEST"),
    (
        "topic-0-partitions",
        "POST",
        "/v1/topics",
        {"name": "x", "partitions": 0},
        422,
        "INVALID_REQUEST",
    ),
    (
        "topic-10001-partitions",
        "POST",
        "/v1/topics",
        {"name": "x", "partitions": 10_001},
        422,
        "INVALID_REQUEST",
    ),
    (
        "topic-bad-dedup",
        "POST",
        "/v1/topics",
        {"name": "x", "partitions": 1, "dedup": "sometimes"},
        422,
        "INVALID_REQUEST",
    ),
    (
        "topic-bad-name",
        "POST",
        "/v1/topics",
        {"name": "a b", "partitions": 1},
        422,
        "INVALID_REQUEST",
    ),
    (
        "topic-rf-over-live",
        "POST",
        "/v1/topics",
        {"name": "x", "partitions": 1, "replication_factor": 2},
        400,
        "INVALID_REQUEST",
    ),
    (
        "topic-exists",
        "POST",
        "/v1/topics",
        {"name": "orders", "partitions": 1},
        409,
        "TOPIC_EXISTS",
    ),
    ("describe-unknown-topic", "GET", "/v1/topics/nope", None, 404, "UNKNOWN_TOPIC_OR_PARTITION"),
    ("unknown-route", "GET", "/v2/everything", None, 404, "INVALID_REQUEST"),
    ("wrong-method", "DELETE", "/v1/lease_pid", None, 405, "INVALID_REQUEST"),
    ("pid-path-0", "GET", "/v1/pids/0", None, 422, "INVALID_REQUEST"),
    ("pid-path-word", "GET", "/v1/pids/abc", None, 422, "INVALID_REQUEST"),
    ("pids-bad-state", "GET", "/v1/pids?state=zombie", None, 422, "INVALID_REQUEST"),
    ("pids-bad-limit", "GET", "/v1/pids?limit=-1", None, 422, "INVALID_REQUEST"),
    ("pid-unknown", "GET", f"/v1/pids/{10**15}", None, 404, "UNKNOWN_PID"),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "error"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_malformed_request_gets_its_4xx(
    cluster: LocalCluster,
    named: dict[str, Any],
    method: str,
    path: str,
    body: Any,
    status: int,
    error: str,
) -> None:
    json_type = {"content-type": "application/json"}
    kw: dict[str, Any] = {}
    if body is STREAMED_10MB:
        kw = {"content": _chunks(), "headers": json_type}
    elif callable(body):
        kw = {"json": body(named)}
    elif isinstance(body, bytes):
        kw = {"content": body, "headers": json_type}
    elif body is None and method == "POST":
        kw = {"content": b"null", "headers": json_type}
    elif body is not None:
        kw = {"json": body}
    with httpx.Client(base_url=cluster.coordinator_url, timeout=60) as client:
        r = client.request(method, path, **kw)
    assert r.status_code == status, r.text[:500]
    got = r.json()
    assert got["error"] == error
    assert isinstance(got["detail"], str) and got["detail"]


def test_service_keeps_serving_after_the_malformed_requests(cluster: LocalCluster) -> None:
    # Runs after the parametrized cases (same module, same cluster).
    status, body = http_json("POST", cluster.coordinator_url + "/v1/lease_pid", L)
    assert status == 200 and body["error"] == "NONE" and body["sequence_number"] == 0
    status, _ = http_json("GET", cluster.coordinator_url + "/healthz")
    assert status == 200
    assert cluster.coordinators[0].alive
    log = cluster.coordinators[0].log_path.read_text()
    assert "unexpected error" not in log and "Traceback" not in log
    metrics = httpx.get(cluster.coordinator_url + "/metrics").text
    assert 'pidlease_errors_total{code="INVALID_REQUEST"}' in metrics
    # Nothing a refused request carried was created.
    status, topics = http_json("GET", cluster.coordinator_url + "/v1/topics")
    assert [t["name"] for t in topics["topics"]] == ["orders"]
    assert len(CASES) >= 30
