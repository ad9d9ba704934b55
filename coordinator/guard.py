"""The outermost ASGI layer of the coordinator: request size cap, optional API token, and
the last line of defence against 500s.

The size cap is enforced before anything buffers the body: a ``content-length`` over
``bytes_max`` is refused at once, and a streamed (chunked) body is counted as it arrives
and refused as soon as it passes the cap, so a 10 MB upload costs at most ``bytes_max``
of memory. The 413 goes out without ``connection: close``; uvicorn then reads and drops
the rest of the upload, so the client gets to read the answer.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from typing import Any

from pidlease.errors import InvalidRequest, PidleaseError, Unauthorized

Scope = dict[str, Any]
Message = dict[str, Any]


async def send_json(send: Callable[[Message], Any], status: int, body: dict[str, Any]) -> None:
    raw = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(raw)).encode())]})
    await send({"type": "http.response.body", "body": raw})


class Guard:
    def __init__(self, app: Any, *, bytes_max: int, api_token: str = "",
                 on_unexpected: Callable[[BaseException], tuple[int, dict[str, Any]]],
                 on_reject: Callable[[PidleaseError], None] | None = None) -> None:
        self.app = app
        self.bytes_max = bytes_max
        self.api_token = api_token.encode()
        self.on_unexpected = on_unexpected
        self.on_reject = on_reject or (lambda err: None)

    async def _reject(self, send: Callable[[Message], Any], status: int, err: PidleaseError) -> None:
        self.on_reject(err)
        await send_json(send, status, err.to_json())

    async def __call__(self, scope: Scope, receive: Callable[[], Any], send: Callable[[Message], Any]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if self.api_token and scope.get("path", "").startswith("/v1/"):
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, b"Bearer " + self.api_token):
                await self._reject(send, 401, Unauthorized("missing or wrong API token "
                                                           "(Authorization: Bearer <token>)"))
                return
        length = headers.get(b"content-length")
        if length is not None:
            if not length.isdigit():
                await self._reject(send, 400, InvalidRequest("content-length is not a number"))
                return
            if int(length) > self.bytes_max:
                await self._reject(send, 413, InvalidRequest(
                    f"request body of {int(length)} bytes is over the limit of {self.bytes_max}"))
                return
        body = bytearray()
        more = True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body += msg.get("body", b"")
            if len(body) > self.bytes_max:
                await self._reject(send, 413, InvalidRequest(
                    f"request body is over the limit of {self.bytes_max} bytes"))
                return
            more = bool(msg.get("more_body", False))

        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()  # only a disconnect can come now

        started = False

        async def tracked_send(msg: Message) -> None:
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, replay, tracked_send)
        except Exception as exc:  # noqa: BLE001 - the point of this layer
            status, payload = self.on_unexpected(exc)
            if not started:
                await send_json(send, status, payload)
