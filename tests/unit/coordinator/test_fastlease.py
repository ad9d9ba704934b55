"""The short path for ``POST /v1/lease_pid`` (coordinator/fastlease.py) against FastAPI's
route, differentially: the same request through an app with the short path and through
one without it must get the same status, the same JSON and the same call to the lease
service (or none). Hypothesis generates well-formed, ill-typed, out-of-range and
undecodable bodies."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.app import Coordinator, create_app
from coordinator.fastlease import FastLease
from coordinator.settings import CoordinatorSettings
from pidlease.errors import ProducerFenced, UnknownPid


class FakeResult:
    def __init__(self, req: Any, who: Any) -> None:
        self.req, self.who = req, who

    def to_json(self) -> dict[str, Any]:
        return {"error": "NONE", **asdict(self.req), "principal": self.who.name}


def make_app(short_path: bool, calls: list[Any]) -> Any:
    s = CoordinatorSettings(zk="127.0.0.1:1/none", request_bytes_max=4096)
    coord = Coordinator(s)

    def lease(req: Any, who: Any = None) -> Any:
        calls.append(req)
        if req.pid == 7:
            raise ProducerFenced("stale generation", generation=3)
        if req.pid == 8:
            raise UnknownPid("never leased")
        return FakeResult(req, who)

    coord.service.lease = lease  # type: ignore[method-assign]
    app = create_app(coordinator=coord, start=False)
    if not short_path:
        app.user_middleware = [m for m in app.user_middleware if m.cls is not FastLease]
    return app


async def call(app: Any, body: bytes, content_type: str) -> tuple[int, Any]:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://coordinator") as c:
        r = await c.post("/v1/lease_pid", content=body, headers={"content-type": content_type})
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, r.text


scalars = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([-1, 0, 1, 7, 8, 2**63 - 1]),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.booleans(),
    st.none(),
)
bodies = st.fixed_dictionaries(
    {"topic": st.one_of(st.sampled_from(["orders", "t", "", "a/b", ".."]), scalars)},
    optional={
        "partition": st.one_of(st.integers(-3, 2**32), scalars),
        "pid": st.one_of(st.sampled_from([-1, 7, 8, 42]), scalars),
        "generation": st.one_of(st.integers(-2, 2**33), scalars),
        "expire_ms": st.one_of(st.integers(-5, 2**64), scalars),
        "producer_name": st.one_of(st.sampled_from(["job", ".", "", "x" * 300]), scalars),
        "extra": scalars,
    },
)
valid = st.fixed_dictionaries(
    {
        "topic": st.sampled_from(["orders", "t-1"]),
        "partition": st.integers(0, 5),
        "pid": st.sampled_from([-1, 7, 8, 42]),
    },
    optional={"expire_ms": st.integers(1, 10**9), "producer_name": st.sampled_from(["job", "b"])},
).flatmap(
    lambda b: (
        st.just(b)
        if b["pid"] == -1
        else st.one_of(st.just(b), st.integers(0, 1000).map(lambda g: {**b, "generation": g}))
    )
)
raw = st.one_of(
    valid.map(lambda b: json.dumps(b).encode()),
    valid.map(lambda b: json.dumps(b).encode()),
    bodies.map(lambda b: json.dumps(b).encode()),
    st.binary(max_size=40),
    st.sampled_from(
        [
            b"",
            b"[]",
            b"null",
            b'{"topic": "t", "partition": 0, "pid": -1',
            b'{"topic":"t","partition":0,"pid":-1,"pid":5}',
        ]
    ),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=raw, content_type=st.sampled_from(["application/json", "application/json; charset=utf-8"])
)
def test_short_path_answers_exactly_as_the_route(body: bytes, content_type: str) -> None:
    fast_calls: list[Any] = []
    slow_calls: list[Any] = []
    fast = asyncio.run(call(make_app(True, fast_calls), body, content_type))
    slow = asyncio.run(call(make_app(False, slow_calls), body, content_type))
    assert fast == slow, (body, fast, slow)
    assert fast_calls == slow_calls
    assert fast[0] != 500


def test_short_path_is_taken_for_a_good_request() -> None:
    calls: list[Any] = []
    app = make_app(True, calls)
    status, body = asyncio.run(
        call(app, b'{"topic": "orders", "partition": 1, "pid": -1}', "application/json")
    )
    assert status == 200 and body["topic"] == "orders" and body["principal"] == "anonymous"
    # the middleware instance is built lazily by Starlette; find it and check it served it
    stack = app.middleware_stack
    seen = []
    while stack is not None and len(seen) < 20:
        seen.append(stack)
        stack = getattr(stack, "app", None)
    served = [m.served for m in seen if isinstance(m, FastLease)]
    assert served == [1]
