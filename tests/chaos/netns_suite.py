"""The nemesis suite on namespace hosts (netns_cluster.py): producers pipeline into a
replicated topic while one nemesis at a time cuts real links, then heals; after each one
the exactly-once checker (checker.py) reads the whole log and compares it with every
acknowledgement so far.

Per nemesis it measures what a user would see: records acked, present, lost, duplicated;
the unavailability window (the longest stretch with no ack, per producer, from the
nemesis on); and, for the nemeses that move leadership, when the new leader was elected
(from ZooKeeper) and whether the old leader acknowledged anything after that. The
minimum-ISR nemesis checks that no record was acknowledged with fewer than two copies
(replica log ends read just before the heal); the isolated-follower one counts the
ZooKeeper writes to partition states (znode versions) to show ISR flapping or its absence.

The nemeses themselves are in netns_nemeses.py. ``python -m tests.chaos.netns --all`` runs
every nemesis (the long form); the pytest module test_netns.py runs a short form.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from checker import Acked, CheckReport, check, read_topic
from netns_cluster import CLIENT, NetCluster, hosts_for
from netns_nemeses import Nemesis, Target

from pidlease import errors
from pidlease.client.producer import Producer
from pidlease.testing.netns import Network

TOPIC = "nemesis"
IDLE_TOPIC = "idle"  # never produced to: its ISR writes show flapping on idle partitions
PARTITIONS = 3
IDLE_PARTITIONS = 7  # as in the figure (139 ZooKeeper writes in 11 s, 7 partitions)
PRODUCERS = 2
SEND_BURST = 20
SEND_PAUSE_S = 0.02  # ~1000 records/s per producer: enough to see every gap
SETTLE_MAX_S = 90.0
PRODUCER_KW: dict[str, Any] = {
    "max_in_flight": 5,
    "linger_ms": 5,
    "batch_records_max": 200,
    "buffer_records_max": 4_000,
    "start_timeout_ms": 60_000,
}
STEPDOWN_SLACK_S = 0.05


# -- the load ------------------------------------------------------------------------------
@dataclass
class AckAt:
    producer: int
    t: float  # wall clock (time.time()) when the SDK resolved the future
    partition: int
    pid: int
    sequence_id: int
    offset: int
    duplicate: bool


class RetrySpy(logging.Handler):
    """Counts the SDK's retries by error name (it logs each at INFO): how a producer
    sees NOT_ENOUGH_REPLICAS, which it retries rather than fails."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.by_name: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg.startswith("partition %s: retrying after") and len(record.args or ()) >= 2:
            name = str(record.args[1])  # type: ignore[index]
            self.by_name[name] = self.by_name.get(name, 0) + 1


class Load:
    """``PRODUCERS`` producers, each on its own thread, sending until stopped."""

    def __init__(self, url: str, idx0: int) -> None:
        self.url = url
        self.acks: list[AckAt] = []
        self.failed: dict[str, int] = {}
        self.sent = 0
        self.lock = threading.Lock()
        self.stop_flag = threading.Event()
        self.producers = [
            Producer(url, TOPIC, producer_name=f"netns-{idx0 + i}", **PRODUCER_KW)
            for i in range(PRODUCERS)
        ]
        self.futures: list[Any] = []
        self.threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(PRODUCERS)
        ]

    def start(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def _on_done(self, i: int, pid: int, fut: Any) -> None:
        now = time.time()
        exc = fut.exception()
        with self.lock:
            if exc is not None:
                self.failed[type(exc).__name__] = self.failed.get(type(exc).__name__, 0) + 1
                return
            md = fut.result()
            self.acks.append(
                AckAt(i, now, md.partition, pid, md.sequence_id, md.offset, md.duplicate)
            )

    def _run(self, i: int) -> None:
        p = self.producers[i]
        n = 0
        while not self.stop_flag.is_set():
            try:
                for _ in range(SEND_BURST):
                    fut = p.send(b"p%d-%d" % (i, n), key=b"k%d" % (n % 101))
                    fut.add_done_callback(lambda f, i=i, pid=p.pid: self._on_done(i, pid, f))
                    n += 1
                    with self.lock:
                        self.sent += 1
            except errors.PidleaseError as exc:
                with self.lock:
                    self.failed[f"send:{exc.name}"] = self.failed.get(f"send:{exc.name}", 0) + 1
                return
            time.sleep(SEND_PAUSE_S)

    def stop(self, timeout_s: float = 120.0) -> None:
        self.stop_flag.set()
        for t in self.threads:
            t.join(timeout_s)
        for p in self.producers:
            with contextlib.suppress(errors.PidleaseError):
                p.close(timeout_ms=timeout_s * 1000)


# -- one nemesis, measured -----------------------------------------------------------------
@dataclass
class PhaseResult:
    name: str
    hold_s: float
    sent: int = 0
    acked: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    report: CheckReport | None = None
    windows_s: list[float] = field(default_factory=list)  # per producer, from the nemesis on
    p0_window_s: float = 0.0  # partition 0 (whose leader the nemesis targets)
    others_window_s: float = 0.0  # the longest of the other partitions'
    retries: dict[str, int] = field(default_factory=dict)
    elected_after_s: float | None = None  # new leader of partition 0, from the nemesis
    acked_again_after_election_s: float | None = None
    old_leader_acks_after_election: int | None = None
    old_leader_last_ack_vs_election_s: float | None = None
    stepdown_after_s: float | None = None  # the old leader's "stepping down" log line
    old_leader_acks_after_stepdown: int | None = None
    fewer_copies_acks: int | None = None
    isr_writes: int | None = None  # ZooKeeper writes to partition states during the hold
    isr_writes_idle: int | None = None  # of those, on the idle topic
    notes: list[str] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return self.report.acked_missing if self.report else -1

    @property
    def duplicated(self) -> int:
        return self.report.duplicated if self.report else -1

    def row(self) -> str:
        w = max(self.windows_s) if self.windows_s else float("nan")
        present = self.report.acked - self.report.acked_missing if self.report else -1
        total_acked = self.report.acked if self.report else -1
        return (
            f"| {self.name} | {self.acked} | {present}/{total_acked} | {self.lost} | "
            f"{self.duplicated} | {w:.1f} s | {self.p0_window_s:.1f} s | "
            f"{self.others_window_s:.1f} s |"
        )

    def summary(self) -> str:
        parts = [
            f"NEMESIS {self.name} (hold {self.hold_s:.0f} s): sent {self.sent}, acked "
            f"{self.acked}, failed {self.failed}, windows per producer "
            f"{[round(w, 2) for w in self.windows_s]} s, partition 0 {self.p0_window_s:.2f} s, "
            f"other partitions {self.others_window_s:.2f} s, "
            f"retries {self.retries}"
        ]
        if self.elected_after_s is not None:
            parts.append(
                f"  new leader elected {self.elected_after_s:.2f} s after the nemesis; acked "
                f"again {self.acked_again_after_election_s} s after the election; old leader's "
                f"acks after the election {self.old_leader_acks_after_election} (its last ack "
                f"{self.old_leader_last_ack_vs_election_s} s from the election)"
            )
        if self.stepdown_after_s is not None:
            parts.append(
                f"  old leader stepped down {self.stepdown_after_s:.2f} s after the nemesis; "
                f"its acks received after that: {self.old_leader_acks_after_stepdown}"
            )
        if self.fewer_copies_acks is not None:
            parts.append(f"  acks with fewer than two copies: {self.fewer_copies_acks}")
        if self.isr_writes is not None:
            parts.append(
                f"  ZooKeeper partition-state writes during the hold: {self.isr_writes} "
                f"(idle topic's {IDLE_PARTITIONS} partitions: {self.isr_writes_idle})"
            )
        parts += [f"  note: {n}" for n in self.notes]
        parts.append(f"  {self.report.summary() if self.report else 'no check'}")
        return "\n".join(parts)


def longest_gap(times: list[float], start: float, end: float) -> float:
    """The longest stretch in [start, end] with no time in ``times``."""
    pts = [start, *sorted(t for t in times if start < t < end), end]
    return max(b - a for a, b in itertools.pairwise(pts))


@dataclass
class Suite:
    net: Network
    cluster: NetCluster
    hold_s: float
    all_acks: list[AckAt] = field(default_factory=list)
    results: list[PhaseResult] = field(default_factory=list)
    spy: RetrySpy = field(default_factory=RetrySpy)
    _loads: int = 0

    def setup(self) -> None:
        self.cluster.create_topic(TOPIC, PARTITIONS, 3, min_insync_replicas=2)
        self.cluster.create_topic(IDLE_TOPIC, IDLE_PARTITIONS, 3, min_insync_replicas=2)
        plog = logging.getLogger("pidlease.client.producer")
        plog.addHandler(self.spy)
        plog.setLevel(logging.INFO)
        self.wait_full_isr()

    def teardown(self) -> None:
        logging.getLogger("pidlease.client.producer").removeHandler(self.spy)

    def wait_full_isr(self, timeout_s: float = SETTLE_MAX_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = [self.cluster.partition_state(TOPIC, p)[0] for p in range(PARTITIONS)]
            if all(len(s.isr) == 3 and s.leader > 0 for s in states):
                return
            time.sleep(0.2)
        raise TimeoutError(f"partitions not fully in sync after {timeout_s}s: {states}")

    def state_versions(self, topic: str, partitions: int) -> int:
        return sum(self.cluster.partition_state(topic, p)[1].version for p in range(partitions))

    def run(self, nem: Nemesis) -> PhaseResult:
        res = PhaseResult(nem.name, self.hold_s)
        print(f"NEMESIS {nem.name}: {nem.what}", flush=True)
        self.wait_full_isr()
        ps = self.cluster.partition_state(TOPIC, 0)[0]
        lid = ps.leader
        target = Target(f"s{lid}", [f"s{r}" for r in ps.replicas if r != lid], lid)
        retries0 = dict(self.spy.by_name)
        load = Load(self.cluster.coordinator_url, self._loads * PRODUCERS).start()
        self._loads += 1
        leader_log: list[tuple[float, int, int]] = []  # (when written, leader, epoch)
        watching = threading.Event()
        watcher = threading.Thread(
            target=self._watch_leader, args=(leader_log, watching), daemon=True
        )
        try:
            time.sleep(2.0)  # acks flowing before the nemesis
            v0 = self.state_versions(TOPIC, PARTITIONS)
            vi0 = self.state_versions(IDLE_TOPIC, IDLE_PARTITIONS)
            watcher.start()
            t_inject = time.time()
            nem.inject(self.net, self.cluster, target)
            time.sleep(self.hold_s)
            if nem.count_isr_writes:
                with contextlib.suppress(Exception):  # ZooKeeper may be cut: then unknown
                    res.isr_writes = self.state_versions(TOPIC, PARTITIONS) - v0
                    res.isr_writes_idle = self.state_versions(IDLE_TOPIC, IDLE_PARTITIONS) - vi0
            if nem.min_isr_check:
                leos = self.replica_log_ends()
                t_leos = time.time()
            note = nem.heal(self.net, self.cluster, target)
            if note:
                res.notes.append(note)
            t_heal = time.time()
            self.wait_acks_after(load, t_heal)
        finally:
            watching.set()
            load.stop()
        t_end = time.time()
        res.sent, res.acked, res.failed = load.sent, len(load.acks), dict(load.failed)
        res.retries = {
            k: v - retries0.get(k, 0) for k, v in self.spy.by_name.items() if v > retries0.get(k, 0)
        }
        self.all_acks += load.acks
        res.windows_s = [
            longest_gap([a.t for a in load.acks if a.producer == i], t_inject, t_end)
            for i in range(PRODUCERS)
        ]
        res.p0_window_s = longest_gap([a.t for a in load.acks if a.partition == 0], t_inject, t_end)
        res.others_window_s = max(
            longest_gap([a.t for a in load.acks if a.partition == p], t_inject, t_end)
            for p in range(1, PARTITIONS)
        )
        if nem.min_isr_check:
            res.fewer_copies_acks = self.fewer_copies([a for a in load.acks if a.t < t_leos], leos)
        if nem.moves_leader:
            self.leader_checks(res, load.acks, leader_log, lid, t_inject)
        self.wait_full_isr()
        res.report = check(
            read_topic(self.cluster.coordinator_url, TOPIC, PARTITIONS),
            [Acked(a.partition, a.pid, a.sequence_id, a.offset) for a in self.all_acks],
        )
        self.results.append(res)
        print(res.summary(), flush=True)
        return res

    def _watch_leader(self, out: list[tuple[float, int, int]], done: threading.Event) -> None:
        last = None
        while not done.is_set():
            with contextlib.suppress(Exception):  # ZooKeeper unreachable for a while
                st, stat = self.cluster.partition_state(TOPIC, 0)
                if (st.leader, st.leader_epoch) != last:
                    last = (st.leader, st.leader_epoch)
                    # ZooKeeper's own time of the write (same machine, same clock): up to
                    # one poll earlier than seeing it here.
                    out.append((stat.mtime / 1000.0, st.leader, st.leader_epoch))
            time.sleep(0.05)

    def wait_acks_after(self, load: Load, t: float) -> None:
        """Until every producer and every partition has an ack after ``t`` (bounded)."""
        deadline = time.monotonic() + SETTLE_MAX_S
        while time.monotonic() < deadline:
            with load.lock:
                late = [a for a in load.acks if a.t > t]
            if {a.producer for a in late} == set(range(PRODUCERS)) and {
                a.partition for a in late
            } == set(range(PARTITIONS)):
                time.sleep(1.0)
                return
            time.sleep(0.1)

    def replica_log_ends(self) -> dict[int, list[int]]:
        """Partition -> every reachable replica's log end offset."""
        out: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
        for sid in self.cluster.server_ids():
            m = self.cluster.metrics(sid)
            for p in range(PARTITIONS):
                key = f'pidlease_server_log_end_offset{{topic="{TOPIC}",partition="{p}"}}'
                if key in m:
                    out[p].append(int(m[key]))
        return out

    @staticmethod
    def fewer_copies(acks: list[AckAt], leos: dict[int, list[int]]) -> int:
        """Acks of records that fewer than two replicas held just before the heal (a
        record at offset o is held by every replica whose log end is beyond o)."""
        bad = 0
        for a in acks:
            ends = sorted(leos.get(a.partition, []), reverse=True)
            second = ends[1] if len(ends) > 1 else -1
            if a.offset >= 0 and a.offset >= second:
                bad += 1
        return bad

    def leader_checks(
        self,
        res: PhaseResult,
        acks: list[AckAt],
        leader_log: list[tuple[float, int, int]],
        old: int,
        t_inject: float,
    ) -> None:
        new = next(((t, ldr, ep) for t, ldr, ep in leader_log if ldr not in (old, -1)), None)
        if new is None:
            res.notes.append(f"partition 0 kept leader {old} (no election seen)")
            return
        t_e, new_leader, epoch = new
        res.elected_after_s = round(t_e - t_inject, 2)
        start = self.cluster.epoch_starts(new_leader, TOPIC, 0).get(epoch)
        p0 = sorted((a for a in acks if a.partition == 0), key=lambda a: a.t)
        again = next((a.t for a in p0 if a.t > t_e), None)
        res.acked_again_after_election_s = None if again is None else round(again - t_e, 2)
        if start is None:
            res.notes.append(f"no start offset for epoch {epoch} on server {new_leader}")
            return
        # A fresh append by the new leader is at or beyond its epoch's start; an ack below
        # it that is not a DUPLICATE answer was the old leader's.
        old_acks = [a for a in p0 if a.offset < start and not a.duplicate]
        res.old_leader_acks_after_election = sum(a.t > t_e for a in old_acks)
        if old_acks:
            res.old_leader_last_ack_vs_election_s = round(old_acks[-1].t - t_e, 3)
        t_down = self.stepdown_time(old, t_inject)
        if t_down is not None:
            res.stepdown_after_s = round(t_down - t_inject, 2)
            # Received here up to a few ms after the old leader sent it: STEPDOWN_SLACK_S.
            res.old_leader_acks_after_stepdown = sum(
                a.t > t_down + STEPDOWN_SLACK_S for a in old_acks
            )

    def stepdown_time(self, server_id: int, since: float) -> float | None:
        """When the server logged stepping down from partition 0 (after ``since``), by
        its log's clock (the same machine's)."""
        marker = f" {TOPIC}-0: stepping down from epoch "
        path = self.cluster.procs[f"s{server_id}"].log_path
        for line in path.read_text(errors="replace").splitlines():
            if marker in line:
                stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")  # noqa: DTZ007 - local, as logging wrote it
                t = stamp.timestamp()
                if t >= since:
                    return t
        return None

    def identical_replicas(self, timeout_s: float = SETTLE_MAX_S) -> list[str]:
        """Wait until every replica has the same log end, then compare the log bytes on
        disk; the partitions whose replicas differ."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leos = self.replica_log_ends()
            if all(len(v) == 3 and len(set(v)) == 1 for v in leos.values()):
                break
            time.sleep(0.5)
        differ = []
        for p in range(PARTITIONS):
            blobs = {self.cluster.log_bytes(s, TOPIC, p) for s in self.cluster.server_ids()}
            if len(blobs) != 1:
                differ.append(f"partition {p}: {len(blobs)} different logs")
        return differ


def table(results: list[PhaseResult], command: str) -> str:
    head = (
        "| nemesis | acked | present (all acks so far) | lost | duplicated | longest gap "
        "between acks (a producer) | partition 0 | other partitions |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    return "\n".join([f"Command: `{command}`", "", head, *(r.row() for r in results)])


@contextlib.contextmanager
def netns_cluster(base: Path, server_env: dict[str, str], *, spare_hosts: int = 0) -> Any:
    """A Network and a started NetCluster of three servers (and ``spare_hosts`` hosts for
    servers added later), the calling thread in the client host; every namespace, bridge
    and process removed afterwards, also on failure."""
    net = Network(hosts_for(3 + spare_hosts))
    try:
        net.start()
        with net.entered(CLIENT):
            cluster = NetCluster(net, base, 3, server_env)
            try:
                cluster.start()
                yield net, cluster
            except BaseException:
                print(cluster.logs(60), flush=True)
                raise
            finally:
                cluster.stop()
    finally:
        net.close()
