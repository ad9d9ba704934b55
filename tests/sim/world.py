"""One simulated run: the world a seed builds, the faults it schedules, and the checks.

``run_seed(seed)`` builds everything from ``random.Random(seed)``: topics (strict,
monotonic, off; some created while producers already send), server settings, producers
(lineages, takeovers), and a fault plan (crashes with torn tails, ENOSPC and EIO on
write, failing and slow fsyncs, connection cuts and delays, ZooKeeper failed writes and
session expiry). It runs the real server code on the simulated loop until every producer
is done (or the virtual deadline passes), crashes the servers one last time, recovers
them from their files, and checks the result (checker.py)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import gc
import logging
import os
import random
import re
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import partition_server.atomic_file
import partition_server.flusher
import partition_server.log
import partition_server.log_manager
import partition_server.partition
import partition_server.registry
import partition_server.replication
import partition_server.server
from partition_server.leadership import ZkLease
from partition_server.log import PartitionLog
from partition_server.partition import Partition, parse_dir_name
from partition_server.server import PartitionServer
from partition_server.settings import ServerSettings
from pidlease.wire import protocol as P
from pidlease.wire.cluster import (
    ALL_ROOTS,
    SEGMENT_MS_DEFAULT,
    PartitionState,
    TopicSpec,
    partition_path,
    topic_path,
)
from tests.sim.disk import DiskFaults, DiskShim
from tests.sim.elastic import Elastic
from tests.sim.kproducer import API_TOKENS, PRINCIPALS, KafkaProducer
from tests.sim.loop import NODE, Idle, Node, SimLoop
from tests.sim.net import SimNetwork
from tests.sim.producer import Lineage, Producer
from tests.sim.zk import FakeZk, FakeZkClient

# The simulation's seam: the server modules whose ``os`` (disk writes: DiskShim), ``time``
# (clocks: _VirtualTime) and ``asyncio`` (sleep(0) yields that last a few virtual ms:
# _SlowYields) ``World.patched`` replaces. tests/unit/repo/test_sim_seam.py fails when a server
# module reaches one of them outside these (or its list of known escapes).
DISK_MODULES = (
    partition_server.log,
    partition_server.flusher,
    partition_server.atomic_file,
)  # (the log manager's recovery fsync is the log's: ``PartitionLog.fsync_all``)
CLOCK_MODULES = (
    partition_server.log,
    partition_server.replication,
    partition_server.registry,
    partition_server.server,
)
YIELD_MODULES = (partition_server.partition,)

SECRET = "sim-secret"
EPOCH_MS = 1_700_000_000_000
ZK3_P = 0.05  # seeds with a 3-server ZooKeeper, when not asked for (--zk3) or against
KAFKA_P = 0.4  # seeds with Kafka producers, when not asked for (--kafka) or against
DEADLINE_S = 60.0  # virtual; a run not done by then is stuck (a liveness failure)
_TMP_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@dataclass
class Result:
    seed: int
    failures: list[str] = field(default_factory=list)
    faults: dict[str, int] = field(default_factory=dict)
    checks: int = 0
    acked: int = 0
    kafka_acked: int = 0  # of which by Kafka producers
    batches: int = 0
    virtual_s: float = 0.0
    segments_deleted: int = 0  # by retention, all servers
    wall_s: float = 0.0
    trace: list[str] = field(default_factory=list)
    plan: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failures


class ServerNode:
    """One partition server id and its successive incarnations (processes)."""

    def __init__(self, world: World, sid: int) -> None:
        self.w = world
        self.sid = sid
        self.host = f"sim-{sid}"
        self.port = 9000 + sid
        self.address = f"{self.host}:{self.port}"
        self.kafka_port = 9100 + sid
        self.kafka_address = f"{self.host}:{self.kafka_port}"
        self.data_dir = os.path.join(world.tmp, f"server-{sid}")
        self.node: Node | None = None
        self.server: PartitionServer | None = None
        self.zkc: FakeZkClient | None = None
        self.incarnation = 0
        self.up = False
        self.crashes = 0
        self._settings: ServerSettings | None = None

    def settings(self) -> ServerSettings:
        if self._settings is None:  # pydantic-settings reads the environment: once
            self._settings = ServerSettings(
                zk="sim",
                lease_secret=SECRET,
                server_id=self.sid,
                host=self.host,
                port=self.port,
                data_dir=self.data_dir,
                kafka_port=self.kafka_port if self.w.kafka else 0,
                **self.w.server_opts,
            )
        return self._settings

    def start(self) -> None:
        if self.node is not None and self.node.alive:
            # A restart still pending from a crash, after the final restart already ran:
            # two processes on one data directory is not a fault this models.
            return
        self.incarnation += 1
        node = self.node = Node(f"s{self.sid}#{self.incarnation}")
        ctx = contextvars.copy_context()
        ctx.run(NODE.set, node)
        asyncio.get_running_loop().create_task(self._boot(node), context=ctx)

    async def _boot(self, node: Node) -> None:
        """The real ``PartitionServer.start()``: its ZooKeeper connection is the fake one
        (``registry.connect`` replaced), its listeners (our port, the Kafka port) are on
        the simulated network (``asyncio.start_server`` patched)."""
        w = self.w
        try:
            srv = PartitionServer(self.settings(), clock_ms=w.clock_ms)
            self.server = srv
            reg = srv.registry

            def connect() -> None:
                zkc = self.zkc = w.zk.client(node.name)
                reg.zk = zkc
                zkc.add_listener(reg._on_state)
                # The leader's lease on its session (docs/replication.md, Step-down), as
                # the real connect() sets it; heartbeats from the loop (no threads here),
                # on the virtual clock (this module's `time` patches).
                s = self.settings()
                reg.lease = ZkLease(s.zk_session_timeout_ms, s.zk_step_down_margin_ms)
                reg.heartbeat_on_loop = True

            reg.connect = connect  # type: ignore[method-assign]
            srv.log_manager.flusher._on_error = lambda exc: self.crash(f"fsync failed: {exc}")
            recover = srv.log_manager.recover

            def recovered(a: Any) -> Any:
                out = recover(a)
                for key, part in srv.log_manager.partitions.items():
                    w.check_log_start(part, "recovery")
                    if (node.name, key) in w.rebuilt_from_log_start:
                        w.note_lost_pids(GAP_RECOVERY, part, node.name)
                rec = srv.log_manager.recovery
                w.trace(
                    "server",
                    f"{node.name} recovered: snapshot {rec['snapshot']}, "
                    f"{rec['batches']} batches, {rec['batches_replayed']} replayed, "
                    f"{rec['truncations']} truncations",
                )
                return out

            srv.log_manager.recover = recovered  # type: ignore[method-assign]
            await srv.start()
            self.up = True
            w.trace("server", f"{node.name} serving")
        except Exception as exc:  # noqa: BLE001 - a failed start is a crash; restart it
            w.trace("server", f"{node.name} failed to start: {type(exc).__name__}: {exc}")
            self.crash("failed start", restart=True)

    def crash(self, why: str, *, restart: bool = True) -> None:
        """SIGKILL: nothing of the process runs again; files keep what was fsynced plus a
        random part of the rest."""
        node = self.node
        if node is None or not node.alive:
            return
        node.alive = False
        self.up = False
        self.crashes += 1
        w = self.w
        w.net.unlisten_node(node)
        w.net.cut_node(node)
        notes = w.disk.crash(node, self.data_dir)
        w.trace("server", f"{node.name} CRASH ({why}); torn: {'; '.join(notes) or 'nothing'}")
        if self.zkc is not None:
            session = self.zkc.session
            w.world_later(w.rng.uniform(0.01, 0.2), w.zk.expire, session)
        if restart:
            # Now and then down for long (with retention: the leader's log start passes
            # this replica's end meanwhile, and it starts over).
            long_down = w.retention and w.rng.random() < 0.2
            w.world_later(
                w.rng.uniform(0.1, 0.3) if long_down else w.rng.uniform(0.002, 0.08), self.start
            )


class World:
    def __init__(
        self,
        seed: int,
        *,
        verbose: bool = False,
        retention: bool = False,
        kafka: bool | None = None,
        zk3: bool | None = None,
    ) -> None:
        self.seed = seed
        # A 3-server ZooKeeper ensemble, one member cut off from the quorum now and then
        # (zk.py): always, never, or in some seeds by the seed (None).
        self.zk3_mode = zk3
        # Kafka producers (kproducer.py) on the servers' Kafka listeners: always (True),
        # never (False), or in some seeds by the seed (None).
        self.kafka_mode = kafka
        self.kafka = False
        self.kafka_sasl = False
        self.rng = random.Random(seed)
        self.verbose = verbose
        self.retention = retention
        self.secret = SECRET.encode()
        self.result = Result(seed)
        self.trace_lines: list[str] = []
        self.loop = SimLoop(self._executor_delay)
        self.loop.set_exception_handler(self._loop_exception)
        self.world_ctx = contextvars.copy_context()
        self.tmp = tempfile.mkdtemp(prefix=f"pidlease-sim-{seed}-", dir=_TMP_ROOT)
        self.faults = DiskFaults()
        self.disk = DiskShim(self.rng, self.loop.time, self.faults, self.trace)
        self.net = SimNetwork(self.rng, self.trace, self.world_ctx)
        self.zk3 = self.zk3_mode if self.zk3_mode is not None else self.rng.random() < ZK3_P
        self.zk = FakeZk(self.rng, self.trace, servers=3 if self.zk3 else 1)
        self.zk.on_owner_read = self.owner_read
        self.zk.on_quorum_expiry = self.quorum_expired
        self.servers: dict[int, ServerNode] = {}
        self.lineages: list[Lineage] = []
        self.topics: dict[str, TopicSpec] = {}
        self.server_opts: dict[str, Any] = {}
        self.n_servers = 1
        self.capture_chunk_pids = self.rng.choice([1, 2, 20_000])
        self.result.plan["capture_chunk_pids"] = self.capture_chunk_pids
        self.final = False  # the end: no more faults
        # Buggify (FoundationDB's word): faults aimed at the narrow windows the exactly-once
        # holes of issue 23 need, on in some seeds: a crash shortly after a follower
        # starts over (restart_at) or cuts its log, a ZooKeeper session that expires while
        # a Kafka produce waits for the owner of its PID.
        self.buggify = False
        self.buggify_p = 0.0
        self.buggify_crashes = 0
        self.buggify_expiries = 0
        self.pending = 0  # late takeovers still to come: the run waits for them
        self.short_retention: set[str] = set()  # topics with a retention policy (--retention)
        self.fsync_slow_p = 0.0
        self.checks = 0
        self.fault_counts: dict[str, int] = {}
        # Retention: every batch a deletion took, per partition, from any server (base
        # offset -> batch bytes; committed, so the same on every replica), and the highest
        # log start each partition directory has shown (it never goes back).
        self.deleted: dict[tuple[str, int], dict[int, bytes]] = {}
        self.log_start_seen: dict[str, int] = {}
        self.segments_deleted = 0
        # Former known gaps (docs/replication.md, "Retention on replicas"; both fixed, kept
        # to explain a failure): (node, partition) whose recovery rebuilt producer state
        # from the log start, and (partition, pid) -> where a replica lost that PID's state.
        self.rebuilt_from_log_start: set[tuple[str, tuple[str, int]]] = set()
        self.lost_pids: dict[tuple[tuple[str, int], int], str] = {}
        self._reported_differ: set[tuple[tuple[str, int], int]] = set()

    # -- small services ----------------------------------------------------------------------
    def clock_ms(self) -> int:
        return EPOCH_MS + int(self.loop.time() * 1000)

    def trace(self, kind: str, msg: str) -> None:
        self.trace_lines.append(f"{self.loop.time() * 1000:10.3f}ms {kind:6} {msg}")

    def violation(self, msg: str, *, pid_at: tuple[tuple[str, int], int] | None = None) -> None:
        """A failed check. ``pid_at`` (partition, pid): the failure is about that PID there;
        when a replica was seen to lose that PID's state (``note_lost_pids``), the message
        says where. Both former known gaps are fixed, so this is a failure too."""
        gap = self.lost_pids.get(pid_at) if pid_at is not None else None
        if gap is not None:
            msg = f"{msg} (its state was lost on a replica after: {gap})"
        self.trace("FAIL", msg)
        self.result.failures.append(msg)

    def note_lost_pids(self, gap: str, part: Partition, where: str) -> None:
        """After ``gap`` on a replica: the PIDs with batches retention deleted below its log
        start (committed, so their state belongs on every replica) that it no longer knows."""
        key = (part.topic, part.partition)
        start = part.log.log_start_offset
        had = {
            P.decode_batch_header(raw).pid
            for base, raw in self.deleted.get(key, {}).items()
            if base < start
        }
        lost = sorted(had - set(part.state.pids()))
        if lost:
            self.trace("GAP", f"{where} {key[0]}-{key[1]}: {gap}; state of pids {lost} lost")
        for pid in lost:
            self.lost_pids.setdefault((key, pid), gap)

    def _loop_exception(self, _loop: Any, context: dict[str, Any]) -> None:
        msg = context.get("message", "")
        if "never retrieved" in msg:
            return  # a reset reader nobody read again; not a fault
        exc = context.get("exception")
        self.violation(f"unhandled error in a callback: {msg}: {type(exc).__name__}: {exc}")

    def count(self, fault: str) -> None:
        self.fault_counts[fault] = self.fault_counts.get(fault, 0) + 1

    def world_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> None:
        self.loop.call_later(delay, fn, *args, context=self.world_ctx)

    def _executor_delay(self, func: Callable[..., Any]) -> float:
        d = self.rng.random() * 0.0005
        name = getattr(func, "__name__", "")
        if name in ("_read_all", "read_now"):
            d += self.rng.uniform(0.0005, 0.005)  # reading the whole tree: several round trips
        elif name == "_fsync_all" and self.rng.random() < self.fsync_slow_p:
            d += self.rng.uniform(0.005, 0.05)
        elif self.rng.random() < 0.05:
            d += self.rng.random() * 0.01
        return d

    def _leader(self, topic: str, partition: int) -> int:
        z = self.zk.nodes.get(partition_path(topic, partition))
        sid = PartitionState.from_bytes(z.data).leader if z is not None else 1
        return sid if sid in self.servers else 1

    def kafka_address(self, sid: int) -> str:
        return self.servers[sid].kafka_address

    def kafka_leader_address(self, topic: str, partition: int) -> str:
        return self.kafka_address(self._leader(topic, partition))

    def any_live_server(self) -> int:
        live = [sid for sid, s in sorted(self.servers.items()) if s.up]
        return self.rng.choice(live) if live else 0

    def leader_address(self, topic: str, partition: int) -> str:
        z = self.zk.nodes.get(partition_path(topic, partition))
        sid = PartitionState.from_bytes(z.data).leader if z is not None else 1
        return self.servers[sid].address if sid in self.servers else "sim-1:9001"

    # -- invariants checked while running -----------------------------------------------------
    def check_durable(self, part: Partition, what: str) -> None:
        self.checks += 1
        on_disk = self.disk.fsynced_end(part.log)
        if part.flushed_end > on_disk or part.high_watermark > on_disk:
            self.violation(
                f"{part.topic}-{part.partition}: {what} leaves flushed_end "
                f"{part.flushed_end} / high watermark {part.high_watermark} above "
                f"what is fsynced ({on_disk})"
            )

    def check_log_start(self, part: Partition, what: str) -> None:
        """The log start is never above the high watermark (retention deletes committed
        batches only) and never goes back, within a process or across restarts."""
        self.checks += 1
        start = part.log.log_start_offset
        if start > part.high_watermark:
            self.violation(
                f"{part.topic}-{part.partition}: after {what} the log start {start} is "
                f"above the high watermark {part.high_watermark}"
            )
        d = str(part.log.dir)
        seen = self.log_start_seen.get(d, 0)
        if start < seen:
            self.violation(
                f"{part.topic}-{part.partition} on {d.split('/')[-2]}: after {what} the "
                f"log start went back from {seen} to {start}"
            )
        elif start > seen:
            self.log_start_seen[d] = start

    def archive_below(self, plog: PartitionLog, offset: int) -> None:
        """Keep what retention is about to delete (below ``offset``), so the checker sees
        the whole history of the partition, not only what is left of it."""
        key = parse_dir_name(plog.dir.name)
        start = plog.log_start_offset
        if key is None or offset <= start:
            return
        kept = self.deleted.setdefault(key, {})
        for chunk in plog.read(start, 1 << 40, offset):
            for h, pos in P.iter_batches(chunk):
                raw = bytes(chunk[pos : pos + h.size])
                old = kept.setdefault(h.base_offset, raw)
                if old != raw and (key, h.base_offset) not in self._reported_differ:
                    self._reported_differ.add((key, h.base_offset))
                    self.violation(
                        f"{key[0]}-{key[1]}: retention on two servers deleted different "
                        f"batches at offset {h.base_offset} (replicas differ below the "
                        f"high watermark)"
                    )

    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        world = self
        saved: list[tuple[Any, str, Any]] = []

        def put(obj: Any, name: str, value: Any) -> None:
            saved.append((obj, name, getattr(obj, name)))
            setattr(obj, name, value)

        for mod in DISK_MODULES:
            put(mod, "os", self.disk)
        # Recovery runs a full gc pass and freezes the heap (a production speed-up for
        # millions of long-lived objects); here it would only cost ~5 ms per boot.
        put(partition_server.log_manager, "gc", _NoGcPasses())
        put(partition_server.partition, "gc", _NoGcPasses())
        # Clocks the server code reads directly: virtual too (replication's checkpoint and
        # reconcile timers, the rate limit of a log line, a start time in ZooKeeper, how
        # long a connection remembers a partition a re-read did not find: on the wall
        # clock a whole run lasts under a second, so no request re-read ZooKeeper again).
        vtime = _VirtualTime(self)
        for mod in CLOCK_MODULES:
            put(mod, "time", vtime)
        put(partition_server.log, "_last_write_failure_log_s", -1e9)
        orig_mark, orig_set_hw = Partition.mark_durable, Partition.set_high_watermark

        def mark_durable(part: Partition, end_offset: int) -> None:
            orig_mark(part, end_offset)
            world.check_durable(part, f"mark_durable({end_offset})")

        def set_high_watermark(part: Partition, hw: int) -> None:
            orig_set_hw(part, hw)
            world.check_durable(part, f"set_high_watermark({hw})")
            world.check_log_start(part, f"set_high_watermark({hw})")

        # Retention persists the new log start before it deletes anything (and a crash in
        # between leaves the deletion to the next open): the batches below it are kept
        # aside here, for the checker.
        orig_persist = PartitionLog.persist_log_start

        def persist_log_start(plog: PartitionLog, offset: int) -> None:
            world.archive_below(plog, offset)
            orig_persist(plog, offset)

        orig_delete = PartitionLog.delete_below

        def delete_below(plog: PartitionLog, offset: int) -> tuple[int, int]:
            n, nbytes = orig_delete(plog, offset)
            world.segments_deleted += n
            return n, nbytes

        put(PartitionLog, "persist_log_start", persist_log_start)
        put(PartitionLog, "delete_below", delete_below)

        orig_restart = Partition.restart_at

        def restart_at(part: Partition, offset: int, *args: Any, **kw: Any) -> None:
            orig_restart(part, offset, *args, **kw)
            node = NODE.get()
            world.note_lost_pids(GAP_SKIPPED, part, node.name if node else "?")
            world.count("restart_at")
            world.after_event(
                f"{part.topic}-{part.partition} started over at {offset}",
                node,
                (part.topic, part.partition),
            )

        put(Partition, "restart_at", restart_at)
        orig_truncate = Partition.truncate_to

        def truncate_to(part: Partition, offset: int, *args: Any, **kw: Any) -> Any:
            end = part.log.next_offset
            out = orig_truncate(part, offset, *args, **kw)
            if offset < end:
                world.count("log_cut")
                world.after_event(
                    f"{part.topic}-{part.partition} cut from {end} to {offset}",
                    NODE.get(),
                    (part.topic, part.partition),
                )
            return out

        put(Partition, "truncate_to", truncate_to)

        # Snapshots export producer state in chunks with the loop free in between; the
        # chunk is 20 000 PIDs in production, so with the sim's handful of PIDs capture
        # would never yield. A seed-chosen small chunk gives the interleavings a server
        # with many PIDs has.
        orig_capture = Partition.capture
        chunk = self.capture_chunk_pids

        def capture(part: Partition, chunk_pids: int = chunk) -> Any:
            return orig_capture(part, chunk_pids)

        put(Partition, "capture", capture)
        # Exporting a chunk of rows takes CPU time in production (ms for 20 000 PIDs), and
        # other callbacks run in between; in virtual time it would take none. A yield in
        # partition.py (capture's) lasts a seed-chosen few ms of virtual time instead.
        for mod in YIELD_MODULES:
            put(mod, "asyncio", _SlowYields(self.rng))
        put(Partition, "mark_durable", mark_durable)
        put(Partition, "set_high_watermark", set_high_watermark)
        put(asyncio, "open_connection", self.net.open_connection)
        put(asyncio, "start_server", self.net.start_server)
        handler: logging.Handler = _TraceHandler(self) if self.verbose else _GapHandler(self)
        plog = logging.getLogger("partition_server")
        old_level, old_prop = plog.level, plog.propagate
        plog.addHandler(handler)
        plog.setLevel(logging.INFO if self.verbose else logging.WARNING)
        plog.propagate = False
        try:
            yield
        finally:
            for obj, name, value in reversed(saved):
                setattr(obj, name, value)
            plog.removeHandler(handler)
            plog.setLevel(old_level)
            plog.propagate = old_prop

    # -- the plan ------------------------------------------------------------------------------
    def plan_only(self) -> dict[str, Any]:
        """The plan this seed makes, without running it (tests of the mix)."""
        try:
            for root in ALL_ROOTS:
                self.zk.create(root, b"", makepath=True)
            self.plan()
            return dict(self.result.plan)
        finally:
            _close_loop(self.loop)
            shutil.rmtree(self.tmp, ignore_errors=True)

    def plan(self) -> None:
        rng = self.rng
        plan = self.result.plan
        self.server_opts = {
            "fsync": rng.choice(["batch", "interval"]),
            "fsync_interval_ms": rng.choice([0, 1, 2, 5]),
            "segment_bytes_max": rng.choice([4096, 8192, 1 << 20]),
            "snapshot_interval_batches": rng.choice([3, 10, 40, 10_000]),
            "snapshot_interval_ms": rng.choice([10, 50, 200, 30_000]),
            "snapshots_kept": rng.choice([1, 2]),
            "inflight_requests_max_per_connection": rng.choice([2, 5, 1000]),
            "pid_expire_check_ms": 1000,
        }
        if self.retention:
            self.server_opts["retention_check_ms"] = rng.choice([10, 20, 50])
        if self.zk3:
            plan["zk"] = "3 servers"
        self.kafka = self.kafka_mode if self.kafka_mode is not None else rng.random() < KAFKA_P
        if self.kafka:
            self.kafka_sasl = rng.random() < 0.8
            if self.kafka_sasl:
                self.server_opts["api_tokens"] = API_TOKENS
            plan["kafka"] = "sasl" if self.kafka_sasl else "no sasl"
        self.n_servers = 3 if rng.random() < 0.5 else 1
        if self.n_servers > 1:
            self.server_opts.update(
                replica_lag_time_max_ms=rng.choice([100, 300, 1000]),
                replica_fetch_wait_max_ms=rng.choice([5, 20, 100]),
                replica_fetch_timeout_ms=rng.choice([100, 300]),
                replica_fetch_backoff_ms=rng.choice([2, 10, 30]),
                hw_checkpoint_interval_ms=rng.choice([10, 50, 200]),
            )
        plan["server"] = dict(self.server_opts)
        plan["servers"] = self.n_servers
        n_topics = rng.randint(1, 3)
        late = rng.random() < 0.6
        for i in range(n_topics + (1 if late else 0)):
            mode = rng.choice(["strict", "strict", "monotonic", "monotonic", "off"])
            rf = rng.choice([1, 2, 3, 3]) if self.n_servers > 1 else 1
            spec = TopicSpec(f"t{i}", rng.choice([1, 1, 2]), rf, mode)
            created = 0.0 if i < n_topics else rng.uniform(0.005, 0.15)
            self.topics[spec.name] = spec
            desc = f"{spec.name}:{mode}x{spec.partitions}R{rf}@{created * 1000:.0f}ms"
            if self.retention and rng.random() < 0.7:
                self._retention_policy(spec)
                desc += (
                    f" seg{spec.segment_bytes}B/{spec.segment_ms}ms keep {spec.retention_ms}ms"
                    f"/{spec.retention_bytes}B"
                )
            plan.setdefault("topics", []).append(desc)
            if created == 0.0:
                self._create_topic(spec)
            else:
                self.world_later(created, self._create_topic, spec)
            for p in range(spec.partitions):
                for _ in range(rng.choice([1, 1, 2, 3, 6])):
                    start = created + rng.uniform(-0.02, 0.01) if created else rng.uniform(0, 0.02)
                    self._plan_lineage(spec, p, max(start, 0.0))
        self._plan_faults()
        mode = os.environ.get("PIDLEASE_SIM_ELASTIC")
        self.elastic = Elastic(self, None if mode is None else mode == "1")
        self.elastic.plan()  # its own random stream: the draws above are unchanged

    def _retention_policy(self, spec: TopicSpec) -> None:
        """Small segments that retention deletes while the run goes on (a run lasts well
        under a second of virtual time): by age, by size, or both."""
        rng = self.rng
        self.short_retention.add(spec.name)
        spec.segment_bytes = rng.choice([256, 512, 1024, 2048])
        spec.segment_ms = rng.choice([SEGMENT_MS_DEFAULT, SEGMENT_MS_DEFAULT, 20, 100])
        by = rng.choice(["time", "size", "both"])
        spec.retention_ms = rng.choice([0, 10, 50, 200]) if by != "size" else -1
        spec.retention_bytes = rng.choice([0, 500, 1500, 4000]) if by != "time" else -1

    def _plan_lineage(self, spec: TopicSpec, partition: int, start: float) -> None:
        rng = self.rng
        lin = Lineage(
            name=f"L{len(self.lineages)}",
            topic=spec.name,
            partition=partition,
            mode=spec.dedup,
            pid=1000 + len(self.lineages),
            generation=rng.randint(1, 50),
            # some PIDs write a batch or three and go idle: more PIDs per
            # partition, longer snapshot captures
            batches_total=rng.choice([rng.randint(1, 3), rng.randint(5, 40)]),
            # up to 16: a leader's uncommitted tail (cut when it steps down) can hold more
            # than the K (5) batches of one PID that producer state remembers
            max_in_flight=rng.choice([1, 2, 3, 5, 5, 8, 16]),
            records_max=rng.choice([1, 3, 5]),
            holes=rng.random() < 0.5,
            gap_s=rng.choice([0.0, 0.0005, 0.002]),
        )
        if self.kafka and rng.random() < 0.5:
            lin.kind = "kafka"
            lin.pid = -1  # InitProducerId gives it
            lin.principal = rng.choice(sorted(PRINCIPALS))
            lin.max_in_flight = min(lin.max_in_flight, 5)  # Kafka's limit with idempotence
        self.lineages.append(lin)
        self.world_later(start, self._start_producer, lin, False)
        if lin.kind == "native" and rng.random() < 0.2:
            self.world_later(start + rng.uniform(0.005, 0.3), self._takeover, lin)
        if (
            lin.kind == "native"
            and lin.mode != "off"
            and spec.name in self.short_retention
            and rng.random() < 0.3
        ):
            # Takeovers after retention deleted what the PID wrote (its data batches all
            # gone, its state kept), with a crash of the leader between two of them: a
            # replica then cuts its log or recovers, and must still know the PID.
            t = start + rng.uniform(0.2, 0.45)
            self.pending += 1
            self.world_later(t, self._late_takeover, lin, rng.randint(1, 3))
            self.world_later(t + rng.uniform(0.001, 0.05), self._crash_leader, spec.name, partition)
            if rng.random() < 0.6:
                self.pending += 1
                t2 = t + rng.uniform(0.03, 0.2)
                self.world_later(t2, self._late_takeover, lin, rng.randint(1, 3))

    def _start_producer(self, lin: Lineage, takeover: bool) -> Producer:
        p = (
            KafkaProducer(self, lin)
            if lin.kind == "kafka"
            else Producer(self, lin, takeover=takeover)
        )
        lin_current[id(lin)] = p
        self.loop.create_task(p.run(), context=self.world_ctx)
        return p

    def _takeover(self, lin: Lineage) -> None:
        if lin.finished or lin.failed:
            return
        old = lin_current.get(id(lin))
        lin.generation += 1
        self.count("takeover")
        self.trace("fault", f"takeover of {lin.name}: generation {lin.generation}")
        if old is not None:
            old.superseded = True
        self._start_producer(lin, True)

    def _late_takeover(self, lin: Lineage, extra: int) -> None:
        """A new holder of a lineage that may have finished long ago: ``extra`` batches
        more, after a FENCE (the coordinator's takeover)."""
        self.pending -= 1
        if self.final or lin.failed:
            return
        self.trace("fault", f"late takeover of {lin.name}: {extra} more batches")
        lin.batches_total += extra
        lin.finished = False
        self._takeover(lin)

    def _crash_leader(self, topic: str, partition: int) -> None:
        if partition_path(topic, partition) in self.zk.nodes:
            self._crash(self._leader(topic, partition))

    def _create_topic(self, spec: TopicSpec) -> None:
        z = self.zk
        z.create(topic_path(spec.name), spec.to_bytes(), makepath=True)
        for p in range(spec.partitions):
            replicas = self.rng.sample(range(1, self.n_servers + 1), spec.replication_factor)
            z.create(
                partition_path(spec.name, p),
                PartitionState(
                    replicas=replicas, leader=replicas[0], isr=list(replicas)
                ).to_bytes(),
                makepath=True,
            )
        self.trace("zk", f"topic {spec.name} created ({spec.dedup}, {spec.partitions} partitions)")

    def _plan_faults(self) -> None:
        rng = self.rng
        horizon = 0.4
        plan = self.result.plan
        crashes = [0, 0, 1, 1, 2, 3] if self.n_servers == 1 else [0, 1, 2, 3, 4]
        for _ in range(rng.choice(crashes)):
            t = rng.uniform(0.005, horizon)
            plan.setdefault("crashes", []).append(round(t * 1000))
            self.world_later(t, self._crash, rng.randint(1, self.n_servers))
        if rng.random() < 0.35:
            f = self.faults
            f.enospc_from = rng.uniform(0, horizon)
            f.enospc_until = f.enospc_from + rng.uniform(0.005, 0.15)
            f.enospc_p = rng.choice([0.3, 0.7, 1.0])
            plan["enospc"] = (round(f.enospc_from * 1000), round(f.enospc_until * 1000), f.enospc_p)
        if rng.random() < 0.15:
            self.faults.eio_write_p = rng.choice([0.005, 0.02])
            plan["eio_write_p"] = self.faults.eio_write_p
        if rng.random() < 0.1:
            self.faults.fsync_fail_p = rng.choice([0.005, 0.02])
            plan["fsync_fail_p"] = self.faults.fsync_fail_p
        if rng.random() < 0.3:
            self.fsync_slow_p = rng.choice([0.1, 0.5])
            plan["fsync_slow_p"] = self.fsync_slow_p
        self.net.delay_max = rng.choice([0.0002, 0.001, 0.003])
        for _ in range(rng.choice([0, 0, 1, 3, 6])):
            t = rng.uniform(0, horizon)
            plan.setdefault("cuts", []).append(round(t * 1000))
            self.world_later(t, self._cut)
        if rng.random() < 0.2:
            t0 = rng.uniform(0, horizon)
            plan["zk_write_fail"] = round(t0 * 1000)
            self.world_later(t0, self._zk_faults, rng.choice([0.2, 0.6]), rng.choice([0.0, 0.3]))
            self.world_later(t0 + rng.uniform(0.01, 0.1), self._zk_faults, 0.0, 0.0)
        if rng.random() < 0.15:
            t = rng.uniform(0, horizon)
            plan["zk_expiry"] = round(t * 1000)
            self.world_later(t, self._expire, rng.randint(1, self.n_servers))
        if self.kafka and self.n_servers > 1 and rng.random() < 0.5:
            # Leaders step down under Kafka produces (their owner lookups await).
            for _ in range(rng.randint(1, 3)):
                t = rng.uniform(0, horizon)
                plan.setdefault("zk_expiries", []).append(round(t * 1000))
                self.world_later(t, self._expire, rng.randint(1, self.n_servers))
        if self.zk3:
            # A member of the ensemble cut off from the quorum (most often the one a leader
            # talks to); it notices after 0.5-3 s (syncLimit x tickTime; 10 s with
            # zkserver.py's settings), serving stale reads until then.
            for _ in range(rng.choice([1, 1, 2])):
                t = rng.uniform(0.01, horizon)
                until = rng.choice([0.5, 1.5, 3.0])
                plan.setdefault("zk_cut_off", []).append((round(t * 1000), until))
                self.pending += 1  # the run goes on until it is over
                self.world_later(t, self._zk_isolate, until, rng.random() < 0.7)
        if rng.random() < 0.5:
            self.buggify = True
            self.buggify_p = rng.choice([0.1, 0.3, 0.6])
            plan["buggify"] = self.buggify_p

    # -- buggify -------------------------------------------------------------------------------
    def after_event(self, what: str, node: Node | None, key: tuple[str, int] | None = None) -> None:
        """``what`` just happened on ``node`` (a follower started over, cut its log): with
        the seed's buggify odds, SIGKILL that process a moment later, before its next
        snapshot, so its recovery starts from what it persisted (or not) for it. With
        ``key`` (the partition), half the time also SIGKILL its leader a little later, so
        that replica may lead, and take over the lineages of that partition after."""
        if node is None or self.final or not self.buggify or self.buggify_crashes >= 3:
            return
        if self.rng.random() >= self.buggify_p:
            return
        self.buggify_crashes += 1
        delay = self.rng.uniform(0.0002, 0.02)
        self.trace("fault", f"buggify: SIGKILL {node.name} in {delay * 1000:.1f} ms ({what})")
        self.world_later(delay, self._crash_node, node, what)
        if key is None or self.rng.random() >= 0.5:
            return
        t = delay + self.rng.uniform(0.06, 0.15)
        self.world_later(t, self._crash_leader, *key)
        lins = [
            lin
            for lin in self.lineages
            if (lin.topic, lin.partition) == key and lin.kind == "native" and lin.mode != "off"
        ]
        for lin in lins[:3]:
            self.pending += 1
            self.world_later(t + self.rng.uniform(0.02, 0.08), self._late_takeover, lin, 1)

    def _crash_node(self, node: Node, what: str) -> None:
        if self.final or not node.alive:
            return
        sid = int(node.name[1:].split("#")[0])
        s = self.servers[sid]
        if s.node is node:
            self.count("buggify_crash")
            s.crash(f"SIGKILL after {what}")

    def owner_read(self, zkc: FakeZkClient) -> None:
        """A ZooKeeper read of a Kafka PID's owner (``/kafka_pids/<pid>``) was answered:
        with the seed's buggify odds the session expires right after, while the produce
        that asked still waits for it (a read that blocked through a reconnect)."""
        if self.final or not self.buggify or self.buggify_expiries >= 3:
            return
        if self.rng.random() >= self.buggify_p:
            return
        self.buggify_expiries += 1
        self.count("buggify_expiry")
        self.trace("fault", f"buggify: session of {zkc.name} expires during an owner lookup")
        zkc.expire_session()

    def _done_pending(self) -> None:
        self.pending -= 1

    def _zk_isolate(self, until: float, at_a_leader: bool) -> None:
        # The run waits for the quorum's expiry of the sessions cut off (the lease check),
        # not for the end of a long window.
        self.world_later(min(until, self.zk.session_timeout_s + 0.05), self._done_pending)
        if self.final:
            return
        zid = self.rng.randrange(len(self.zk.ensemble))
        if at_a_leader:
            leaders = sorted(
                {
                    PartitionState.from_bytes(z.data).leader
                    for p, z in self.zk.nodes.items()
                    if p.startswith("/topics/") and "/partitions/" in p and z.data
                }
            )
            s = self.servers.get(self.rng.choice(leaders)) if leaders else None
            if s is not None and s.up and s.zkc is not None:
                zid = s.zkc.server
        self.count("zk_cut_off")
        self.zk.isolate(zid, until)

    def quorum_expired(self, session: int, zkc: FakeZkClient) -> None:
        """The ZooKeeper quorum expired ``session`` (attached to a member cut off from it):
        other servers may be elected now, so the process of that session must lead no
        replicated partition any more: its lease (registry.py, ZkLease) ends before the
        session could have expired."""
        for sid, s in sorted(self.servers.items()):
            if s.zkc is not zkc or s.node is None or not s.node.alive or s.server is None:
                continue
            for (topic, p), part in sorted(s.server.log_manager.partitions.items()):
                spec = self.topics.get(topic)
                if spec is None or spec.replication_factor < 2 or not _leads(part):
                    continue
                self.checks += 1
                self.violation(
                    f"{topic}-{p}: server {sid} ({s.node.name}) still leads when the "
                    f"ZooKeeper quorum expired its session 0x{session:x}: its lease outlived "
                    f"the session (confirmed by stale reads of a ZooKeeper server cut off "
                    f"from the quorum)"
                )

    # -- faults ------------------------------------------------------------------------------
    def _crash(self, sid: int) -> None:
        if self.final:
            return
        s = self.servers[sid]
        if s.node is not None and s.node.alive:
            self.count("crash")
            s.crash("SIGKILL")

    def _cut(self) -> None:
        if self.final:
            return
        before = self.net.cuts
        self.net.cut_random()
        if self.net.cuts > before:
            self.count("cut")

    def _zk_faults(self, write_p: float, read_p: float) -> None:
        if self.final and (write_p or read_p):
            return
        self.zk.write_fail_p, self.zk.read_fail_p = write_p, read_p
        self.trace("fault", f"zookeeper write failure p={write_p}, read failure p={read_p}")
        if write_p or read_p:
            self.count("zk_failures")

    def _expire(self, sid: int) -> None:
        if self.final:
            return
        s = self.servers[sid]
        if s.up and s.zkc is not None:
            self.count("zk_expiry")
            self.trace("fault", f"zookeeper session of {s.node.name if s.node else sid} expires")
            s.zkc.expire_session()

    # -- the run -------------------------------------------------------------------------------
    async def main(self) -> None:
        for root in ALL_ROOTS:
            self.zk.create(root, b"", makepath=True)
        # The cluster's PID counter (the coordinator's blocks and InitProducerId's): the
        # native lineages' PIDs (1000 + n) are below it.
        self.zk.create("/pid_block", b"100000")
        self.plan()
        for sid in range(1, self.n_servers + 1):
            self.servers[sid] = ServerNode(self, sid)
            self.servers[sid].start()
        while self.loop.time() < DEADLINE_S:
            await asyncio.sleep(0.01)
            if not self.pending and all(lin.finished or lin.failed for lin in self.lineages):
                break
        else:
            stuck = [
                f"{lin.name}({lin.topic}-{lin.partition}, sent {lin.sent})"
                for lin in self.lineages
                if not (lin.finished or lin.failed)
            ]
            self.violation(
                f"stuck: producers not done after {DEADLINE_S:.0f}s of virtual "
                f"time: {', '.join(stuck)}"
            )
        for lin in self.lineages:
            if lin.failed:
                self.violation(
                    f"producer {lin.name} ({lin.mode}) failed: {lin.failed}",
                    pid_at=((lin.topic, lin.partition), lin.pid),
                )
        # Quiet, then one last SIGKILL and recovery from the files: what is left is checked.
        self.final = True
        self._zk_faults(0.0, 0.0)
        self.zk.heal_all()
        self.faults.enospc_until = self.faults.eio_write_p = self.faults.fsync_fail_p = 0.0
        for s in self.servers.values():
            s.crash("final", restart=False)
        for s in self.servers.values():
            s.start()
        for _ in range(2000):
            if all(s.up for s in self.servers.values()):
                break
            await asyncio.sleep(0.005)
        else:
            self.violation("a server did not come back after the final restart")
            return
        for _ in range(1000):  # replicated partitions: a leader, caught up
            if self._settled():
                break
            await asyncio.sleep(0.005)
        else:
            self.trace("world", "not settled after the final restart; checking anyway")
        from tests.sim.checker import check

        check(self)

    def _settled(self) -> bool:
        for name, spec in self.topics.items():
            for p in range(spec.partitions):
                z = self.zk.nodes.get(partition_path(name, p))
                if z is None:
                    continue
                ps = PartitionState.from_bytes(z.data)
                srv = self.servers[ps.leader].server if ps.leader in self.servers else None
                part = srv.log_manager.partitions.get((name, p)) if srv is not None else None
                if part is None or not _leads(part) or part.high_watermark < part.log.next_offset:
                    return False
        return True


lin_current: dict[int, Producer] = {}


def _leads(part: Partition) -> bool:
    """The replica leads (a role string, or an enum whose name or value says so)."""
    role = part.role
    names = {str(role), str(getattr(role, "value", "")), str(getattr(role, "name", ""))}
    return any(n.lower().rsplit(".", 1)[-1] == "leader" for n in names)


class _SlowYields:
    """``asyncio`` for partition.py: ``sleep(0)`` (a yield between chunks of work) lasts
    the time the chunk took."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    def sleep(self, delay: float, result: Any = None) -> Any:
        return asyncio.sleep(delay or self._rng.uniform(0.0, 0.005), result)


class _NoGcPasses:
    """``gc`` for log_manager.py and partition.py: the run keeps the collector off (its timing
    would make runs differ: a killed node's coroutines run finally blocks when collected),
    so no collect, freeze, enable or disable from the server code."""

    def __getattr__(self, name: str) -> Any:
        return getattr(gc, name)

    def collect(self, *_: Any) -> int:
        return 0

    def freeze(self) -> None:
        pass

    def enable(self) -> None:
        pass

    def disable(self) -> None:
        pass

    def isenabled(self) -> bool:
        return False


class _VirtualTime:
    """``time`` with the simulation's clock (perf_counter stays real: durations in logs)."""

    def __init__(self, world: World) -> None:
        self._w = world

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def monotonic(self) -> float:
        return self._w.loop.time()

    def time(self) -> float:
        return self._w.clock_ms() / 1000


GAP_RECOVERY = "recovery rebuilt producer state from the log start"
GAP_SKIPPED = "a follower started over at its leader's log start"
# The warnings partition.py logs when recovery does not trust the snapshot (a cut after it,
# or a log ending before its covered_to) and rebuilds producer state from the log start:
# the first known gap. Not "the log starts above the snapshot's replay offset" alone: with
# a trusted snapshot that is retention deleting above replay_from, a bug.
_REBUILD_TEMPLATES = ("rebuilding producer state from offset 0",)


def _note_rebuild(world: World, record: logging.LogRecord) -> None:
    msg = record.msg
    if isinstance(msg, str) and any(t in msg for t in _REBUILD_TEMPLATES):
        node = NODE.get()
        args = record.args
        if node is not None and isinstance(args, tuple) and len(args) >= 2:
            world.rebuilt_from_log_start.add((node.name, (str(args[0]), int(args[1]))))


class _GapHandler(logging.Handler):
    """Not verbose: only notes the known gaps' warnings."""

    def __init__(self, world: World) -> None:
        super().__init__(logging.WARNING)
        self.world = world

    def emit(self, record: logging.LogRecord) -> None:
        _note_rebuild(self.world, record)


class _TraceHandler(logging.Handler):
    def __init__(self, world: World) -> None:
        super().__init__(logging.INFO)
        self.world = world

    def emit(self, record: logging.LogRecord) -> None:
        _note_rebuild(self.world, record)
        node = NODE.get()
        # Wall-clock durations differ between runs of one seed; nothing else does.
        # ... nor the run's temporary directory (the real start() logs its data dir).
        msg = _WALL_TIME.sub("#s", record.getMessage()).replace(self.world.tmp, "$TMP")
        self.world.trace(
            "log", f"[{node.name if node else '-'}] {record.levelname} {record.name}: {msg}"
        )


_WALL_TIME = re.compile(r"\b\d+\.\d+s\b")


@functools.cache
def _freeze_imports() -> None:
    """Once a process: modules and everything imported so far live as long as the process,
    so keep them out of the per-run collection in run_seed (10 ms a run otherwise)."""
    gc.collect()
    gc.freeze()


def run_seed(
    seed: int,
    *,
    verbose: bool = False,
    retention: bool = False,
    kafka: bool | None = None,
    zk3: bool | None = None,
) -> Result:
    """Run one seed; the result says what failed (empty: all checks held)."""
    # The run's objects hold cycles (tasks, futures, streams); collect them at the end,
    # quietly (closing a killed node's coroutines runs finally blocks that cannot await
    # any more), so no later gc pass finds them in the middle of the next run.
    _freeze_imports()
    hook = sys.unraisablehook
    sys.unraisablehook = lambda _u: None
    try:
        with warnings.catch_warnings():
            # A killed node's coroutines that never started (a wait_for's inner one).
            warnings.filterwarnings(
                "ignore", message="coroutine .* was never awaited", category=RuntimeWarning
            )
            was_enabled = gc.isenabled()
            gc.disable()  # collections at allocation-dependent moments: not in a run
            try:
                r = _run(seed, verbose, retention, kafka, zk3)
            finally:
                gc.collect()
                if was_enabled:
                    gc.enable()
    finally:
        sys.unraisablehook = hook
    return r


def _run(seed: int, verbose: bool, retention: bool, kafka: bool | None, zk3: bool | None) -> Result:
    t0 = time.perf_counter()
    w = World(seed, verbose=verbose, retention=retention, kafka=kafka, zk3=zk3)
    r = w.result
    try:
        with w.patched():
            try:
                w.loop.run_until_complete(w.main())
            except Idle as exc:
                w.violation(f"simulation stalled: {exc}")
            except Exception as exc:  # noqa: BLE001 - report the seed, not a traceback only
                import traceback

                w.violation(f"harness error: {type(exc).__name__}: {exc}")
                w.trace_lines.append(traceback.format_exc())
    finally:
        _close_loop(w.loop)
        w.disk.close_all()  # the last incarnations' files: no process exit closes them here
        lin_current.clear()
        shutil.rmtree(w.tmp, ignore_errors=True)
    r.checks = w.checks
    r.faults = dict(w.fault_counts)
    r.faults["disk"] = w.disk.injected
    r.segments_deleted = w.segments_deleted
    r.acked = sum(len(lin.acked) for lin in w.lineages)
    r.kafka_acked = sum(len(lin.acked) for lin in w.lineages if lin.kind == "kafka")
    r.batches = sum(lin.sent for lin in w.lineages)
    r.virtual_s = w.loop.time()
    r.wall_s = time.perf_counter() - t0
    r.trace = w.trace_lines
    return r


def _close_loop(loop: SimLoop) -> None:
    # Tasks of killed nodes stay pending forever; drop them without warnings (closing
    # their coroutines runs finally blocks that cannot await any more: ignore that too).
    for t in asyncio.all_tasks(loop):
        t._log_destroy_pending = False  # type: ignore[attr-defined]
    loop._ready.clear()  # type: ignore[attr-defined]
    loop._scheduled.clear()  # type: ignore[attr-defined]
    loop.close()
    loop.tasks.clear()
