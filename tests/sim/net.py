"""The simulated network: connections are pairs of byte streams between nodes, each
direction FIFO with a seed-chosen delay per write. Two connections are independent, so
messages on different connections arrive in any order (reordering across connections
only). A cut resets both ends at once and drops whatever was still on the wire.

The server side gets what ``asyncio.start_server`` would hand ``PartitionServer._handle``:
an ``asyncio.StreamReader`` (fed by the network) and a writer with the StreamWriter
surface the server uses."""

from __future__ import annotations

import asyncio
import contextvars
import random
from collections.abc import Awaitable, Callable
from typing import Any

from tests.sim.loop import NODE, Node

Handler = Callable[[asyncio.StreamReader, Any], Awaitable[None]]


class _Transport:
    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class SimWriter:
    def __init__(self, conn: Conn, side: int, owner: Node | None) -> None:
        self.conn = conn
        self.side = side
        self.owner = owner  # a killed owner sends nothing more, whatever runs its code
        self.transport = _Transport()
        self._closed = False

    def _dead(self) -> bool:
        return self.owner is not None and not self.owner.alive

    def write(self, data: bytes) -> None:
        if not self._closed and not self.conn.cut and not self._dead():
            self.conn.send(self.side, bytes(data))

    async def drain(self) -> None:
        if self.conn.cut:
            raise ConnectionResetError("connection reset (sim)")

    def is_closing(self) -> bool:
        return self._closed or self.conn.cut

    def close(self) -> None:
        if not self._closed and not self._dead():
            self._closed = True
            self.conn.send(self.side, None)  # EOF after what is on the wire

    async def wait_closed(self) -> None:
        return None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class Conn:
    def __init__(
        self,
        net: SimNetwork,
        cid: int,
        client: str,
        server: str,
        server_node: Node,
        client_node: Node | None,
    ) -> None:
        self.net = net
        self.cid = cid
        self.client = client
        self.server = server
        self.server_node = server_node
        self.cut = False
        self.readers = (asyncio.StreamReader(limit=2**20), asyncio.StreamReader(limit=2**20))
        self.writers = (SimWriter(self, 0, client_node), SimWriter(self, 1, server_node))
        self._last = [0.0, 0.0]

    def send(self, side: int, data: bytes | None) -> None:
        """Side 0 is the client. ``None`` is an end of stream."""
        loop = asyncio.get_running_loop()
        # Strictly later than the previous write: timers at equal times may run in any order.
        t = max(self._last[side] + 1e-9, loop.time() + self.net.delay())
        self._last[side] = t
        reader = self.readers[1 - side]
        self.net.world_call_at(t, self._deliver, reader, data)

    def _deliver(self, reader: asyncio.StreamReader, data: bytes | None) -> None:
        if self.cut:
            return
        if data is None:
            reader.feed_eof()
        else:
            reader.feed_data(data)

    def reset(self) -> None:
        if self.cut:
            return
        self.cut = True
        for r in self.readers:
            r.set_exception(ConnectionResetError("connection reset (sim)"))


class _Sock:
    def __init__(self, port: int) -> None:
        self._port = port

    def getsockname(self) -> tuple[str, int]:
        return ("sim", self._port)


class SimServer:
    """What ``asyncio.start_server`` returns, as the servers use it."""

    def __init__(self, net: SimNetwork, address: str, port: int, node: Node, handler: Handler):
        self.net = net
        self.address = address
        self.node = node
        self.handler = handler
        self.sockets = [_Sock(port)]

    async def start_serving(self) -> None:
        self.net.listen(self.address, self.node, self.handler)

    def close(self) -> None:
        if self.net.listeners.get(self.address, (None,))[0] is self.node:
            self.net.unlisten(self.address)

    async def wait_closed(self) -> None:
        return None


class SimNetwork:
    def __init__(
        self, rng: random.Random, trace: Callable[[str, str], None], world_ctx: contextvars.Context
    ) -> None:
        self.rng = rng
        self.trace = trace
        self.world_ctx = world_ctx
        self.listeners: dict[str, tuple[Node, Handler]] = {}
        self.conns: list[Conn] = []
        self.delay_max = 0.002
        self.slow_p = 0.02
        self._next_id = 0
        self.cuts = 0

    def delay(self) -> float:
        d = self.rng.random() * self.delay_max
        if self.rng.random() < self.slow_p:
            d += self.rng.random() * 0.02
        return d

    def world_call_at(self, when: float, fn: Callable[..., Any], *args: Any) -> None:
        asyncio.get_running_loop().call_at(when, fn, *args, context=self.world_ctx)

    def listen(self, address: str, node: Node, handler: Handler) -> None:
        self.listeners[address] = (node, handler)

    def unlisten(self, address: str) -> None:
        self.listeners.pop(address, None)

    def unlisten_node(self, node: Node) -> None:
        for address in [a for a, (n, _) in self.listeners.items() if n is node]:
            del self.listeners[address]

    async def connect(self, address: str, client: str) -> tuple[asyncio.StreamReader, SimWriter]:
        await asyncio.sleep(self.delay())
        got = self.listeners.get(address)
        if got is None or not got[0].alive:
            raise ConnectionRefusedError(f"nothing listens on {address} (sim)")
        node, handler = got
        self._next_id += 1
        conn = Conn(self, self._next_id, client, address, node, NODE.get())
        self.conns.append(conn)
        ctx = contextvars.copy_context()
        ctx.run(NODE.set, node)
        asyncio.get_running_loop().create_task(
            handler(conn.readers[1], conn.writers[1]), context=ctx
        )
        return conn.readers[0], conn.writers[0]

    async def start_server(
        self, handler: Handler, host: str, port: int, *, start_serving: bool = True, **_: Any
    ) -> SimServer:
        """Stands in for ``asyncio.start_server`` (the server's own port, the Kafka
        listener's): a listener on ``host:port`` of the calling node, once serving."""
        me = NODE.get()
        assert me is not None, "a server starts on a node"
        srv = SimServer(self, f"{host}:{port}", port, me, handler)
        if start_serving:
            await srv.start_serving()
        return srv

    async def open_connection(self, host: str, port: int, **_: Any) -> tuple[Any, Any]:
        """Stands in for ``asyncio.open_connection`` (the replica fetcher's)."""
        me = NODE.get()
        return await self.connect(f"{host}:{port}", me.name if me else "?")

    def live(self) -> list[Conn]:
        self.conns = [c for c in self.conns if not c.cut]
        return self.conns

    def cut_random(self) -> None:
        live = self.live()
        if live:
            c = self.rng.choice(live)
            self.cuts += 1
            self.trace("net", f"cut connection {c.cid} {c.client} -> {c.server}")
            c.reset()

    def cut_node(self, node: Node) -> None:
        for c in self.live():
            if c.server_node is node or c.client == node.name:
                c.reset()
