"""Simulated producers: the SDK's send protocol for one partition (``pidlease/client/sender.py``),
modelled on its module docstring, without the coordinator.

- batches get their sequences when built and are frozen (a resend sends the same bytes);
- at most ``max_in_flight`` unresolved batches, all written in sequence order to one
  pipelined connection;
- a retriable answer (or a lost connection) stops new sends; once every outstanding
  answer is in, back off, reconnect when needed, and resend every unresolved batch in
  order on one connection;
- OUT_OF_ORDER_SEQUENCE / UNKNOWN_PID behind an earlier unresolved batch is a consequence
  of that one and retried with it; for the earliest unresolved batch it is fatal;
- DUPLICATE is success; FENCED ends the producer (a zombie after a takeover).

A takeover starts a new instance of the same lineage (same PID, generation + 1): it sends
FENCE first, then continues after the durable highwater the fence answer reports, as the
coordinator's takeover does. The old instance keeps sending: it must now be refused.

Each record's value names its lineage, generation and sequence, so the checker can find
it in the log. What the producer saw (acks, answers, offsets) goes to the ledger."""

from __future__ import annotations

import asyncio
import random
import struct
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pidlease import errors
from pidlease.wire import protocol as P
from pidlease.wire.cluster import partition_path
from pidlease.wire.token import make_token

if TYPE_CHECKING:
    from tests.sim.world import World

_U32 = struct.Struct(">I")

RETRIABLE = {
    errors.SequenceUnknown.code,
    errors.NotLeader.code,
    errors.ServerUnavailable.code,
    errors.TooManyPids.code,
    errors.NotEnoughReplicas.code,
    errors.UnknownTopicOrPartition.code,
    errors.CoordinatorUnavailable.code,
}
CONSEQUENCE = {errors.OutOfOrderSequence.code, errors.UnknownPid.code}
CODE_NAMES = {
    c.code: c.name
    for c in (
        errors.SequenceUnknown,
        errors.NotLeader,
        errors.ServerUnavailable,
        errors.TooManyPids,
        errors.NotEnoughReplicas,
        errors.UnknownTopicOrPartition,
        errors.OutOfOrderSequence,
        errors.UnknownPid,
        errors.ProducerFenced,
        errors.Unauthorized,
        errors.InvalidRequest,
        errors.CorruptRecord,
        errors.PidleaseError,
        errors.RecordTooLarge,
    )
}
CODE_NAMES[0] = "OK"
CODE_NAMES[errors.DUPLICATE] = "DUPLICATE"


def code_name(code: int) -> str:
    return CODE_NAMES.get(code, str(code))


@dataclass(eq=False)
class Batch:
    base: int
    count: int
    values: list[bytes]
    data: bytes
    done: bool = False
    sends: int = 0


@dataclass
class Lineage:
    """One logical producer of one partition: a PID and its successive holders."""

    name: str
    topic: str
    partition: int
    mode: str
    pid: int
    generation: int
    batches_total: int
    max_in_flight: int
    records_max: int
    holes: bool  # monotonic: explicit ids with gaps
    gap_s: float = 0.0  # mean time between new batches (linger)
    sent: int = 0  # batches built so far, all holders
    next_seq: int = 0
    instances: int = 0
    failed: str = ""  # an unexpected fatal answer
    finished: bool = False
    acked: dict[bytes, tuple[int, bool]] = field(default_factory=dict)  # value -> offset, dup
    fences: list[tuple[int, int]] = field(default_factory=list)  # (generation, fence offset)
    # Per takeover: (generation, the sequence it resumed after, the highest sequence acked
    # before it); the checker compares the two (a takeover never resumes below an ack).
    resumes: list[tuple[int, int, int]] = field(default_factory=list)
    kind: str = "native"  # or "kafka" (kproducer.py: Kafka's wire protocol)
    principal: str = ""  # kafka, with SASL: who it authenticates as
    acked_seq_max: int = -1  # the highest sequence acked so far (any holder)


class Connection:
    """A client connection; a reader task queues each answer frame, then None at the end."""

    def __init__(self, reader: asyncio.StreamReader, writer: Any) -> None:
        self.reader = reader
        self.writer = writer
        self.last_ok_offset = -1
        self.frames: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                (n,) = _U32.unpack(await self.reader.readexactly(4))
                self.frames.put_nowait(await self.reader.readexactly(n))
        except (ConnectionError, asyncio.IncompleteReadError):
            self.frames.put_nowait(None)

    async def read_frame(self) -> bytes:
        body = await self.frames.get()
        if body is None:
            raise ConnectionResetError("connection lost")
        return body


class Producer:
    """One holder (instance) of a lineage."""

    def __init__(self, world: World, lin: Lineage, *, takeover: bool) -> None:
        self.w = world
        self.lin = lin
        self.rng: random.Random = world.rng
        lin.instances += 1
        self.generation = lin.generation
        self.takeover = takeover
        self.tag = f"{lin.name}.g{self.generation}"
        self.token = (
            make_token(world.secret, lin.pid, self.generation, world.clock_ms() + 10**9)
            if lin.kind == "native"
            else b""
        )
        self.window: deque[Batch] = deque()
        self.conn: Connection | None = None
        self.corr = 0
        self.fenced = False
        self.superseded = False  # a newer holder exists: stop building new batches
        self.next_ready = 0.0  # when the next batch's records are there
        self.reconnect = False

    # -- plumbing ----------------------------------------------------------------------------
    def _trace(self, what: str) -> None:
        self.w.trace("prod", f"{self.tag}: {what}")

    async def _connect(self) -> Connection:
        backoff = 0.002
        while True:
            addr = self.w.leader_address(self.lin.topic, self.lin.partition)
            try:
                r, wr = await self.w.net.connect(addr, self.tag)
                self.conn = Connection(r, wr)
                return self.conn
            except ConnectionError:
                await asyncio.sleep(backoff * (0.5 + self.rng.random()))
                backoff = min(backoff * 2, 0.05)

    def _drop_conn(self) -> None:
        if self.conn is not None:
            self.conn.writer.close()
            self.conn = None

    def _next_corr(self) -> int:
        self.corr += 1
        return self.corr

    # -- the run -----------------------------------------------------------------------------
    async def run(self) -> None:
        try:
            if self.takeover and not await self._fence():
                return
            await self._send_all()
        finally:
            self._drop_conn()

    async def _fence(self) -> bool:
        """FENCE with this holder's generation until it is answered; then resume after the
        durable highwater."""
        lin = self.lin
        backoff = 0.002
        while True:
            conn = self.conn or await self._connect()
            corr = self._next_corr()
            # Odd seeds fence through FENCES, the coordinator's request for many partitions
            # (issue 24), even seeds through FENCE (chosen without drawing from the rng).
            many = self.w.seed % 2 == 1
            mine = 0
            if many:
                entries = self._fence_entries()
                mine = next(
                    i
                    for i, e in enumerate(entries)
                    if (e.topic, e.partition) == (lin.topic, lin.partition)
                )
                frame = P.fences_request(corr, lin.pid, self.generation, self.token, entries)
            else:
                frame = P.fence_request(
                    corr,
                    lin.topic,
                    lin.partition,
                    lin.pid,
                    self.generation,
                    self.token,
                    create_if_absent=True,
                )
            conn.writer.write(frame)
            try:
                r = P.decode_response(P.FENCES if many else P.FENCE, await conn.read_frame())
                if many and r.error_code == 0:
                    assert r.entries is not None and len(r.entries) == len(entries), r
                    # The other entries' answers are the coordinator's to judge (it retries
                    # the takeover when one failed); this holder resumes on its own.
                    r = r.entries[mine]
            except (ConnectionError, asyncio.IncompleteReadError):
                self._drop_conn()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 0.05)
                continue
            if r.error_code == 0:
                lin.fences.append((self.generation, r.fence_offset))
                if self.superseded:
                    # A newer holder started while this fence was on its way: the lineage's
                    # sequences are that holder's now.
                    return False
                lin.resumes.append((self.generation, r.durable_highwater, lin.acked_seq_max))
                if lin.mode == "strict":
                    lin.next_seq = r.durable_highwater + 1
                else:
                    lin.next_seq = max(lin.next_seq, r.durable_highwater + 1)
                self._trace(
                    f"fenced in at offset {r.fence_offset}, durable highwater {r.durable_highwater}"
                )
                return True
            if r.error_code in RETRIABLE:
                if r.error_code == errors.NotLeader.code:
                    self._drop_conn()
                await asyncio.sleep(backoff * (0.5 + self.rng.random()))
                backoff = min(backoff * 2, 0.05)
                continue
            if r.error_code == errors.ProducerFenced.code:
                return False  # an even newer holder
            lin.failed = f"FENCE answered {code_name(r.error_code)}: {r.detail}"
            return False

    def _fence_entries(self) -> list[P.PartitionEntry]:
        """The coordinator's FENCES (issue 24): one request per leader server carrying every
        partition of the PID's record that server leads. Modelled as a PID leased on every
        partition of every topic (a producer's record names them all): this partition,
        then each other partition whose leader in ZooKeeper is this partition's, in the
        coordinator's order (by topic, then partition), each created if absent (the PID
        never wrote there). Fencing the PID there writes a fence record to each of their
        logs and starts its state there, as a real takeover of a wide producer does."""
        lin, w = self.lin, self.w
        leader = w._leader(lin.topic, lin.partition)
        keys = [(lin.topic, lin.partition)]
        for name in sorted(w.topics):
            for q in range(w.topics[name].partitions):
                if (
                    (name, q) != keys[0]
                    and partition_path(name, q) in w.zk.nodes  # created by now
                    and w._leader(name, q) == leader
                ):
                    keys.append((name, q))
        return [P.PartitionEntry(t, q, P.FENCE_CREATE_IF_ABSENT, 0) for t, q in sorted(keys)]

    def _build(self) -> Batch | None:
        lin = self.lin
        if self.superseded or lin.sent >= lin.batches_total:
            return None
        lin.sent += 1
        count = self.rng.randint(1, lin.records_max)
        base = lin.next_seq
        if lin.mode == "monotonic" and lin.holes and self.rng.random() < 0.3:
            base += self.rng.randint(1, 5)
        lin.next_seq = base + count
        values = [
            f"{lin.name}/{self.generation}/{base + i}/".encode() + b"x" * self.rng.randint(0, 8)
            for i in range(count)
        ]
        data = P.encode_batch(
            [(None, v) for v in values],
            pid=lin.pid,
            generation=self.generation,
            base_sequence=base,
            timestamp_ms=self.w.clock_ms(),
        )
        return Batch(base, count, values, data)

    async def _send_all(self) -> None:
        lin = self.lin
        loop = asyncio.get_running_loop()
        backoff = 0.002
        while True:
            conn = self.conn or await self._connect()
            outstanding: deque[tuple[int, Batch]] = deque()
            # Resend every unresolved batch in order, then new ones up to the window.
            for b in self.window:
                if not b.done:
                    outstanding.append((self._send(conn, b), b))
            trouble = False
            while True:
                more = not self.superseded and lin.sent < lin.batches_total
                while (
                    not trouble
                    and more
                    and len(self.window) < lin.max_in_flight
                    and self.next_ready <= loop.time()
                ):
                    b = self._build()
                    if b is None:
                        break
                    self.window.append(b)
                    outstanding.append((self._send(conn, b), b))
                    self.next_ready = (
                        loop.time() + self.rng.expovariate(1 / lin.gap_s) if lin.gap_s else 0.0
                    )
                    more = not self.superseded and lin.sent < lin.batches_total
                can_send = not trouble and more and len(self.window) < lin.max_in_flight
                wait = max(self.next_ready - loop.time(), 0.0) if can_send else None
                if not outstanding:
                    if wait is None:
                        break
                    await asyncio.sleep(wait)
                    continue
                try:
                    body = await asyncio.wait_for(conn.frames.get(), wait)
                except TimeoutError:
                    continue
                if body is None:  # the connection is gone: every outstanding answer is lost
                    self._drop_conn()
                    trouble = True
                    break
                corr, b = outstanding.popleft()
                r = self._decode(body)
                if r.correlation_id != corr:
                    self.w.violation(
                        f"{self.tag}: answer {r.correlation_id} came when "
                        f"{corr} was due (one connection answers in order)"
                    )
                verdict = self._answer(conn, b, r)
                if verdict == "fatal":
                    return
                if verdict == "retry":
                    trouble = True
            while self.window and self.window[0].done:
                self.window.popleft()
            if self.fenced:
                return
            if not self.window and (self.superseded or lin.sent >= lin.batches_total):
                if not self.superseded:
                    lin.finished = True
                return
            if self.reconnect:
                self.reconnect = False
                self._drop_conn()
            if trouble:
                await asyncio.sleep(backoff * (0.5 + self.rng.random()))
                backoff = min(backoff * 2, 0.05)
            else:
                backoff = 0.002

    def _decode(self, body: bytes) -> Any:
        return P.decode_response(P.PRODUCE, body)

    def _send(self, conn: Connection, b: Batch) -> int:
        b.sends += 1
        corr = self._next_corr()
        if self.w.verbose:
            self._trace(f"send [{b.base}..{b.base + b.count - 1}] as request {corr}")
        conn.writer.write(
            P.produce_request(corr, self.lin.topic, self.lin.partition, self.token, b.data)
        )
        return corr

    def _answer(self, conn: Connection, b: Batch, r: P.Response) -> str:
        lin = self.lin
        code = r.error_code
        seqs = f"[{b.base}..{b.base + b.count - 1}]"
        if code in (0, errors.DUPLICATE):
            # A Kafka DUPLICATE is answered NO_ERROR with its first offsets: only a batch
            # sent once is surely a new append there.
            if code == 0 and (lin.kind == "native" or b.sends == 1):
                if r.base_offset <= conn.last_ok_offset:
                    self.w.violation(
                        f"{self.tag}: batch {seqs} appended at offset {r.base_offset}, before "
                        f"the batch sent ahead of it on the same connection (offset "
                        f"{conn.last_ok_offset}): requests applied out of order"
                    )
                conn.last_ok_offset = r.last_offset
            if not b.done:
                b.done = True
                lin.acked_seq_max = max(lin.acked_seq_max, b.base + b.count - 1)
                for i, v in enumerate(b.values):
                    off = r.base_offset + i if r.base_offset >= 0 else -1
                    lin.acked[v] = (off, code != 0)
            self._trace(f"{seqs} {code_name(code)} at {r.base_offset}")
            return "ok"
        self._trace(f"{seqs} {code_name(code)} ({r.detail})")
        if code in RETRIABLE:
            if code == errors.NotLeader.code:
                self.reconnect = True  # the leader moved: find it again (ZooKeeper)
            return "retry"
        earliest = next((x for x in self.window if not x.done), None)
        if code in CONSEQUENCE and earliest is not b:
            return "retry"
        if code == errors.ProducerFenced.code:
            self.fenced = True
            if not self.superseded:
                lin.failed = f"{self.tag} fenced without a takeover: {r.detail}"
            return "fatal"
        if self.superseded and code in CONSEQUENCE:
            # A zombie's batch after its successor wrote: the sequence moved on.
            self.fenced = True
            return "fatal"
        lin.failed = f"{self.tag}: batch {seqs} answered {code_name(code)}: {r.detail}"
        return "fatal"
