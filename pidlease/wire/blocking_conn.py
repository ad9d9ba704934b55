"""A blocking client for the binary protocol (``pidlease.wire.protocol``): one request at
a time on a plain socket, for code without an event loop. The SDK's ``Reader`` uses it
(``pidlease.client.connection`` re-exports it) and so does the coordinator's
``LeaderClient`` (its calls to partition leaders, pooled there); in ``wire`` so the
coordinator need not import the SDK (tests/unit/repo/test_import_graph.py).

Connecting raises ``Unauthorized`` when TLS finds a certificate the context does not trust
(not retriable), ``ServerUnavailable`` for anything else (``tls.connect_error``). A request
has one deadline for send and receive; any trouble closes the connection and raises
``ServerUnavailable`` whose ``__cause__`` says what happened: ``EOFError`` /
``ConnectionError`` (the peer closed it: a pooled connection may simply have gone idle),
``TimeoutError`` / ``OSError`` (no answer in time), ``CorruptRecord`` (an answer that does
not parse, is over the frame limit, or answers another request)."""

from __future__ import annotations

import itertools
import socket
import ssl
import time
from typing import Any, Self

from pidlease.errors import CorruptRecord, ServerUnavailable
from pidlease.wire import protocol
from pidlease.wire.framing import FrameTooLarge, recv_frame
from pidlease.wire.tls import connect_error

REQUEST_TIMEOUT_MS_DEFAULT = 30_000


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` -> (host, port); raises ServerUnavailable when it is not one."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ServerUnavailable(f"partition server address {address!r} is not host:port")
    return host, int(port)


class BlockingConnection:
    """One request at a time to a partition server on a blocking socket."""

    def __init__(
        self,
        address: str,
        *,
        timeout_ms: int = REQUEST_TIMEOUT_MS_DEFAULT,
        frame_bytes_max: int = protocol.FRAME_BYTES_MAX_DEFAULT,
        ssl_context: ssl.SSLContext | None = None,
        what: str = "partition server",
    ) -> None:
        self.address = address
        self.frame_bytes_max = frame_bytes_max
        self.timeout_s = timeout_ms / 1000
        host, port = split_address(address)
        self._sock: socket.socket | None = None
        try:
            sock = socket.create_connection((host, port), timeout=self.timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            raise connect_error(address, exc, what) from exc
        if ssl_context is not None:
            try:
                sock = ssl_context.wrap_socket(sock, server_hostname=host)
            except OSError as exc:  # ssl.SSLError is an OSError
                sock.close()
                raise connect_error(address, exc, what) from exc
        self._sock = sock
        self._corr = itertools.count(1)

    def request(
        self, api_key: int, build: Any, *, timeout_s: float | None = None
    ) -> protocol.Response:
        """Send ``build(correlation_id)``, read and decode the answer within ``timeout_s``
        (the connection's timeout when None). Any socket trouble closes the connection and
        raises ServerUnavailable (its ``__cause__`` says what, see the module docstring)."""
        if self._sock is None:
            raise ServerUnavailable("connection is closed")
        end = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)

        def left() -> float:
            remaining = end - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("deadline passed")
            return remaining

        corr = next(self._corr) & 0xFFFFFFFF
        try:
            self._sock.settimeout(left())
            self._sock.sendall(build(corr))
            body = recv_frame(self._sock, self.frame_bytes_max, timeout_s=left)
            resp = protocol.decode_response(api_key, body)
            if resp.correlation_id != corr:
                raise CorruptRecord(
                    f"{self.address} answered correlation id {resp.correlation_id}, expected {corr}"
                )
        except FrameTooLarge as exc:
            self.close()
            raise ServerUnavailable(
                f"server sent a frame of {exc.size} bytes, over the limit"
            ) from CorruptRecord(str(exc))
        except (EOFError, ConnectionError) as exc:
            self.close()
            raise ServerUnavailable(f"{self.address} closed the connection: {exc}") from exc
        except CorruptRecord as exc:
            self.close()
            raise ServerUnavailable(f"request to {self.address} failed: {exc.detail}") from exc
        except ValueError as exc:
            self.close()
            raise ServerUnavailable(f"request to {self.address} failed: {exc}") from (
                CorruptRecord(str(exc))
            )
        except (OSError, TimeoutError) as exc:
            self.close()
            raise ServerUnavailable(f"request to {self.address} failed: {exc}") from exc
        except ServerUnavailable:
            self.close()
            raise
        return resp

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
