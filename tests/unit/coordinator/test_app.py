"""The coordinator's HTTP layer without ZooKeeper: strict validation, error shapes, size
cap, unknown routes, API token, and "never a 500" (the store here is never connected, so
every valid request meets a retriable COORDINATOR_UNAVAILABLE)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from coordinator.app import Coordinator, create_app
from coordinator.settings import CoordinatorSettings


class TestClient:
    """A blocking client that calls the ASGI app in-process (no server, no lifespan)."""

    __test__ = False

    def __init__(self, app: Any) -> None:
        self.app = app

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://coordinator") as c:
                return await c.request(method, path, **kw)

        return asyncio.run(go())

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.request("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> httpx.Response:
        return self.request("POST", path, **kw)

    def close(self) -> None:
        pass


def make_client(**settings: Any) -> TestClient:
    s = CoordinatorSettings(zk="127.0.0.1:1/none", request_bytes_max=4096, **settings)
    return TestClient(create_app(coordinator=Coordinator(s), start=False))


@pytest.fixture
def client() -> Iterator[TestClient]:
    c = make_client()
    yield c
    c.close()


GOOD = {"topic": "t", "partition": 0, "pid": -1}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**GOOD, "partition": "5"}, "partition"),
        ({**GOOD, "partition": True}, "partition"),
        ({**GOOD, "partition": 1.0}, "partition"),
        ({**GOOD, "partition": -1}, "partition"),
        ({**GOOD, "partition": 2**31}, "partition"),
        ({**GOOD, "pid": 0}, "pid"),
        ({**GOOD, "pid": -2}, "pid"),
        ({**GOOD, "pid": 2**63}, "pid"),
        ({**GOOD, "pid": 2**64 + 5}, "pid"),
        ({**GOOD, "pid": 5, "generation": -1}, "generation"),
        ({**GOOD, "pid": 5, "generation": 2**31}, "generation"),
        ({**GOOD, "generation": 4}, "body"),
        ({**GOOD, "expire_ms": 0}, "expire_ms"),
        ({**GOOD, "expire_ms": 2**63}, "expire_ms"),
        ({**GOOD, "producer_name": ""}, "producer_name"),
        ({**GOOD, "producer_name": "x" * 256}, "producer_name"),
        ({**GOOD, "producer_name": ".."}, "producer_name"),
        ({**GOOD, "topic": "a/b"}, "topic"),
        ({**GOOD, "topic": ""}, "topic"),
        ({**GOOD, "surprise": 1}, "surprise"),
        ({"partition": 0, "pid": -1}, "topic"),
        ([1, 2], "body"),
        (None, "body"),
    ],
)
def test_malformed_lease_is_invalid_request(client: TestClient, body: Any, field: str) -> None:
    r = client.post("/v1/lease_pid", json=body)
    assert r.status_code == 422, r.text
    got = r.json()
    assert got["error"] == "INVALID_REQUEST"
    assert field in got["detail"], got


def test_non_json_body(client: TestClient) -> None:
    r = client.post(
        "/v1/lease_pid", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400
    assert r.json()["error"] == "INVALID_REQUEST" and "not valid JSON" in r.json()["detail"]
    r = client.post("/v1/lease_pid", content=b"topic=t", headers={"content-type": "text/plain"})
    assert r.status_code in (400, 422) and r.json()["error"] == "INVALID_REQUEST"


def test_oversized_bodies_are_413(client: TestClient) -> None:
    r = client.post(
        "/v1/lease_pid", content=b"x" * 5000, headers={"content-type": "application/json"}
    )
    assert r.status_code == 413 and r.json()["error"] == "INVALID_REQUEST"

    async def chunks() -> AsyncIterator[bytes]:  # no content-length: counted as it streams
        for _ in range(10):
            yield b" " * 1000

    r = client.post("/v1/lease_pid", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"] == "INVALID_REQUEST"


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"requests": []},
        {"requests": {}},
        {"requests": [{**GOOD, "pid": 0}]},
        {"requests": [GOOD, {"topic": "t"}]},
        {"requests": [GOOD], "extra": 1},
    ],
)
def test_bad_batches(client: TestClient, body: Any) -> None:
    r = client.post("/v1/lease_pid/batch", json=body)
    assert r.status_code == 422 and r.json()["error"] == "INVALID_REQUEST"


def test_batch_over_the_limit() -> None:
    c = make_client(batch_requests_max=2)
    r = c.post("/v1/lease_pid/batch", json={"requests": [GOOD] * 3})
    assert r.status_code == 400 and "at most 2" in r.json()["detail"]
    c.close()


@pytest.mark.parametrize(
    "body",
    [
        {"name": "t"},
        {"name": "t", "partitions": 0},
        {"name": "t", "partitions": 10_001},
        {"name": "t", "partitions": "3"},
        {"name": "a b", "partitions": 1},
        {"name": "t", "partitions": 1, "dedup": "sometimes"},
        {"name": "t", "partitions": 1, "replication_factor": 0},
        {"name": "..", "partitions": 1},
    ],
)
def test_bad_topics(client: TestClient, body: Any) -> None:
    r = client.post("/v1/topics", json=body)
    assert r.status_code == 422 and r.json()["error"] == "INVALID_REQUEST"


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/nope", 404),
        ("DELETE", "/v1/lease_pid", 405),
        ("GET", "/v1/pids/0", 422),
        ("GET", "/v1/pids/abc", 422),
        ("GET", f"/v1/pids/{2**63}", 422),
        ("GET", "/v1/pids?state=dead", 422),
        ("GET", "/v1/pids?limit=0", 422),
        ("GET", "/v1/topics/a%20b", 400),
    ],
)
def test_routes_and_params(client: TestClient, method: str, path: str, status: int) -> None:
    r = client.request(method, path)
    assert r.status_code == status, r.text
    assert r.json()["error"] == "INVALID_REQUEST" and r.json()["detail"]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/lease_pid", GOOD),
        ("POST", "/v1/lease_pid/batch", {"requests": [GOOD]}),
        ("POST", "/v1/topics", {"name": "t", "partitions": 1}),
        ("GET", "/v1/topics", None),
        ("GET", "/v1/topics/t", None),
        ("GET", "/v1/pids", None),
        ("GET", "/v1/pids/5", None),
        ("GET", "/v1/servers", None),
        ("GET", "/healthz", None),
        ("GET", "/dashboard", None),
    ],
)
def test_zookeeper_down_is_503_never_500(
    client: TestClient, method: str, path: str, body: Any
) -> None:
    r = client.request(method, path, json=body)
    if path.endswith("/batch"):
        assert r.status_code == 200
        assert r.json()["responses"][0]["error"] == "COORDINATOR_UNAVAILABLE"
        return
    assert r.status_code == 503, r.text
    assert r.json()["error"] == "COORDINATOR_UNAVAILABLE" and r.json()["detail"]


def test_metrics_and_openapi_need_no_zookeeper(client: TestClient) -> None:
    client.post("/v1/lease_pid", json={**GOOD, "pid": 0})
    text = client.get("/metrics").text
    assert 'pidlease_errors_total{code="INVALID_REQUEST"} 1' in text
    assert "pidlease_lease_latency_seconds_bucket" in text
    assert "/v1/lease_pid" in client.get("/openapi.json").json()["paths"]


def test_unexpected_exception_becomes_503_json(client: TestClient) -> None:
    coord: Coordinator = client.app.state.coordinator  # type: ignore[attr-defined]

    def boom(*a: Any, **k: Any) -> Any:
        raise RuntimeError("bug")

    coord.service.lease = boom  # type: ignore[method-assign]
    r = client.post("/v1/lease_pid", json=GOOD)
    assert r.status_code == 503
    assert r.json()["error"] == "COORDINATOR_UNAVAILABLE" and "RuntimeError" in r.json()["detail"]


def test_api_token_when_configured() -> None:
    c = make_client(api_token="s3cret")
    r = c.get("/v1/topics")
    assert r.status_code == 401 and r.json()["error"] == "UNAUTHORIZED"
    r = c.get("/v1/topics", headers={"authorization": "Bearer wrong"})
    assert r.status_code == 401
    r = c.get("/v1/topics", headers={"authorization": "Bearer s3cret"})
    assert r.status_code == 503  # past the token; ZooKeeper is down here
    assert c.get("/healthz").status_code == 503  # ops endpoints need no token
    c.close()
