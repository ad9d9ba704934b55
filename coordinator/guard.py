"""The outermost ASGI layer of the coordinator: request size cap, API tokens and scopes
(``auth.py``), and the last line of defence against 500s.

The principal a call is made by goes to the app in ``scope["state"]["principal"]``
(``request.state.principal``); with no principal configured it is ``anonymous`` (admin).
A token that is unknown is 401 UNAUTHORIZED, a known one without the scope the route
needs 403 FORBIDDEN (naming the scope). ``/dashboard`` and ``/dashboard/data`` also take
the token from a cookie, set by opening ``/dashboard?token=...`` once: that answer is a
redirect to ``/dashboard`` (the token leaves the address bar and the history).

The size cap is enforced before anything buffers the body: a ``content-length`` over
``bytes_max`` is refused at once, and a streamed (chunked) body is counted as it arrives
and refused as soon as it passes the cap, so a 10 MB upload costs at most ``bytes_max``
of memory. The 413 goes out without ``connection: close``; uvicorn then reads and drops
the rest of the upload, so the client gets to read the answer.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qs

from coordinator.auth import (
    ANONYMOUS,
    COOKIE_NAME,
    Authenticator,
    Principal,
    build_principals,
    required_scope,
)
from pidlease.errors import Forbidden, InvalidRequest, PidleaseError, Unauthorized

Scope = dict[str, Any]
Message = dict[str, Any]
# ASGI's receive callable: awaiting it gives the next request message.
Receive = Callable[[], Awaitable[Message]]


async def send_json(send: Callable[[Message], Any], status: int, body: dict[str, Any]) -> None:
    raw = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(raw)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": raw})


class Guard:
    def __init__(
        self,
        app: Any,
        *,
        bytes_max: int,
        api_token: str = "",
        on_unexpected: Callable[[BaseException], tuple[int, dict[str, Any]]],
        on_reject: Callable[[PidleaseError], None] | None = None,
        principals: list[Principal] | None = None,
    ) -> None:
        self.app = app
        self.bytes_max = bytes_max
        self.auth = Authenticator(
            principals if principals is not None else build_principals(api_token=api_token)
        )
        self.on_unexpected = on_unexpected
        self.on_reject = on_reject or (lambda err: None)

    async def _reject(
        self, send: Callable[[Message], Any], status: int, err: PidleaseError
    ) -> None:
        self.on_reject(err)
        await send_json(send, status, err.to_json())

    async def __call__(
        self, scope: Scope, receive: Receive, send: Callable[[Message], Any]
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        principal: Principal | None = ANONYMOUS
        if self.auth.enabled:
            path = scope.get("path", "")
            needed = required_scope(scope.get("method", "GET"), path)
            principal = None
            if needed is not None:
                dashboard = not path.startswith("/v1")
                if dashboard and await self._dashboard_login(scope, send):
                    return
                principal = self._principal(headers, cookie=dashboard)
                if principal is None:
                    how = (
                        "Authorization: Bearer <token>, or open /dashboard?token=<admin token>"
                        if dashboard
                        else "Authorization: Bearer <token>"
                    )
                    await self._reject(
                        send, 401, Unauthorized(f"missing or wrong API token ({how})")
                    )
                    return
                if not principal.allows(needed):
                    await self._reject(
                        send,
                        403,
                        Forbidden(
                            f"principal {principal.name!r} has scope {principal.scope!r}; "
                            f"{scope.get('method')} {path} needs scope {needed!r}",
                            needed_scope=needed,
                            principal=principal.name,
                        ),
                    )
                    return
        scope.setdefault("state", {})["principal"] = principal
        await self._serve(scope, receive, send)

    def _principal(self, headers: dict[bytes, bytes], *, cookie: bool) -> Principal | None:
        auth = headers.get(b"authorization")
        if auth is not None:
            return self.auth.by_authorization(auth)
        if cookie and b"cookie" in headers:
            try:
                jar: SimpleCookie = SimpleCookie(headers[b"cookie"].decode("latin-1"))
            except CookieError:
                return None
            morsel = jar.get(COOKIE_NAME)
            if morsel is not None and morsel.value:
                return self.auth.by_token(morsel.value)
        return None

    async def _dashboard_login(self, scope: Scope, send: Callable[[Message], Any]) -> bool:
        """``GET /dashboard?token=...``: check the token, keep it in an HttpOnly cookie and
        redirect to the bare page. True when this answered the request."""
        if scope.get("path") != "/dashboard":
            return False
        query = parse_qs((scope.get("query_string") or b"").decode("latin-1"))
        if "token" not in query:
            return False
        token = query["token"][0]
        principal = self.auth.by_token(token)
        if principal is None:
            await self._reject(send, 401, Unauthorized("the dashboard token is wrong"))
            return True
        if not principal.is_admin:
            await self._reject(
                send,
                403,
                Forbidden(
                    f"principal {principal.name!r} has scope {principal.scope!r}; the dashboard "
                    "needs scope 'admin'",
                    needed_scope="admin",
                    principal=principal.name,
                ),
            )
            return True
        jar: SimpleCookie = SimpleCookie()
        jar[COOKIE_NAME] = token
        morsel = jar[COOKIE_NAME]
        morsel["path"] = "/dashboard"
        morsel["httponly"] = True
        morsel["samesite"] = "Strict"
        if scope.get("scheme") == "https":
            morsel["secure"] = True
        raw = json.dumps({"error": "NONE", "detail": "signed in; see /dashboard"}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 303,
                "headers": [
                    (b"location", b"/dashboard"),
                    (b"set-cookie", morsel.OutputString().encode("latin-1")),
                    (b"cache-control", b"no-store"),
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(raw)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": raw})
        return True

    async def _serve(self, scope: Scope, receive: Receive, send: Callable[[Message], Any]) -> None:
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None:
            if not length.isdigit():
                await self._reject(send, 400, InvalidRequest("content-length is not a number"))
                return
            if int(length) > self.bytes_max:
                await self._reject(
                    send,
                    413,
                    InvalidRequest(
                        f"request body of {int(length)} bytes is over the limit of {self.bytes_max}"
                    ),
                )
                return
        body = bytearray()
        more = True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body += msg.get("body", b"")
            if len(body) > self.bytes_max:
                await self._reject(
                    send,
                    413,
                    InvalidRequest(f"request body is over the limit of {self.bytes_max} bytes"),
                )
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
