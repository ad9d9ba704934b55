"""pidlease.testing.faultproxy against a loopback echo server: forwards, drops, black-holes,
delays, and heals. No timing is asserted beyond "nothing came back while black-holed"."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest

from pidlease.testing.faultproxy import FaultProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.request.sendall(data)


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    with FaultProxy(f"127.0.0.1:{srv.server_address[1]}") as p:
        yield p
    srv.shutdown()
    srv.server_close()


def connect(p: FaultProxy, timeout_s: float = 10.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", p.port), timeout=timeout_s)


def echo(s: socket.socket, data: bytes) -> bytes:
    s.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
    return got


def test_forwards_and_drops(proxy: FaultProxy) -> None:
    with connect(proxy) as s:
        assert echo(s, b"hello") == b"hello"
        assert proxy.drop_all() == 1
        with pytest.raises((ConnectionError, OSError)):  # noqa: PT012 - send, then see the close
            s.sendall(b"x")
            if not s.recv(10):
                raise ConnectionError("closed")
    with connect(proxy) as s:  # new connections work again
        assert echo(s, b"again") == b"again"


def test_blackhole_forwards_nothing_then_heals(proxy: FaultProxy) -> None:
    proxy.blackhole(60)
    with connect(proxy, timeout_s=0.5) as s:
        s.sendall(b"lost")
        with pytest.raises(TimeoutError):
            s.recv(10)
    proxy.heal()
    with connect(proxy) as s:
        assert echo(s, b"back") == b"back"


def test_delay_still_delivers(proxy: FaultProxy) -> None:
    proxy.set_delay(0.05)
    with connect(proxy) as s:
        assert echo(s, b"slow") == b"slow"
    with pytest.raises(ValueError, match="delay must be >= 0"):
        proxy.set_delay(-1)
