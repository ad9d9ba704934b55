"""A short path for the hot route, ``POST /v1/lease_pid``, in front of FastAPI.

Profiling the coordinator under load showed most of its CPU per lease in the framework
(routing, dependency solving, AnyIO's thread hand-off, response serialisation), not in
the lease itself. This ASGI layer sits inside ``Guard`` (so the size cap, the API token
and scopes apply first) and answers a well-formed ``POST /v1/lease_pid`` itself: the body
is validated by the same pydantic model the route declares, the caller is the principal
the guard authenticated, the lease runs on a thread
pool of its own (kazoo is thread-based), and the answer is the same JSON the route gives.

Anything else goes to FastAPI untouched, and so does a lease request this layer does not
accept as is (not ``application/json``, or a body the model refuses): FastAPI then answers
with exactly the error it always gave, so the two paths cannot disagree on bad input. The
route stays declared in FastAPI for ``/openapi.json`` and as the reference behaviour.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import ValidationError

from coordinator.leases import LeaseRequest
from coordinator.schemas import LeaseBody
from pidlease.errors import PidleaseError

Scope = dict[str, Any]
Message = dict[str, Any]
# ASGI's receive callable: awaiting it gives the next request message.
Receive = Callable[[], Awaitable[Message]]

ROUTE = "/v1/lease_pid"
_JSON_HEADERS = [(b"content-type", b"application/json")]


class FastLease:
    def __init__(
        self,
        app: Any,
        *,
        lease: Callable[[LeaseRequest, Any], Any],
        on_error: Callable[[PidleaseError], None],
        threads: int,
    ) -> None:
        self.app = app
        self.lease = lease
        self.on_error = on_error
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="lease")
        self.served = 0  # requests answered here (the rest went to FastAPI)

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def __call__(
        self, scope: Scope, receive: Receive, send: Callable[[Message], Any]
    ) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] != ROUTE
            or scope["method"] != "POST"
            or not _is_json(scope)
        ):
            await self.app(scope, receive, send)
            return
        # Set by the guard (coordinator/auth.py); without it FastAPI's route decides.
        principal = (scope.get("state") or {}).get("principal")
        if principal is None:
            await self.app(scope, receive, send)
            return
        first = await receive()
        if first["type"] != "http.request" or first.get("more_body", False):
            await self.app(scope, _replay(first, receive), send)
            return
        try:
            body = LeaseBody.model_validate_json(first.get("body", b""))
        except ValidationError:
            await self.app(scope, _replay(first, receive), send)
            return
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(
                self.executor, self.lease, body.to_request(), principal
            )
            status, payload = 200, result.to_json()
        except PidleaseError as exc:
            self.on_error(exc)
            status, payload = exc.http_status, exc.to_json()
        self.served += 1
        raw = json.dumps(payload, separators=(",", ":")).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [*_JSON_HEADERS, (b"content-length", str(len(raw)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": raw})


def _is_json(scope: Scope) -> bool:
    name: bytes
    value: bytes  # ASGI headers are (name, value) byte pairs
    for name, value in scope.get("headers") or ():
        if name == b"content-type":
            return value.split(b";", 1)[0].strip().lower() == b"application/json"
    return False


def _replay(first: Message, receive: Receive) -> Receive:
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return first
        return await receive()

    return again
