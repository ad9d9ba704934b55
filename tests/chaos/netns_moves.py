"""Replica moves under the nemesis (issue 27 item 5), on namespace hosts (netns_cluster.py):
producers pipeline into the suite's topic while a fourth server joins, the coordinator
runs ``rebalance`` onto it, then drains one of the first three servers, then drains the
fourth again (a round; rounds again, at most 4, while faults are left: moves can be
quicker than faults; the long form at least two, the faults in each), with the move
throttle low so a catch-up lasts, and a fault is injected at each phase of the moves as
they are seen in ZooKeeper (the move records under ``/moves`` and the partitions' states):

- a move's **add** phase (the new replica catching up): the new replica cut from the
  partition's leader for a few seconds, then SIGKILLed and restarted;
- its **lead** phase (the move's new first replica leads): that replica, the moving one,
  SIGKILLed and restarted (an election among the others meanwhile);
- the next add: the **coordinator** running the job SIGKILLed and restarted (the job is
  taken over once its owner node is gone: coordinator/moves.py ``MoveJobs``);
- the next lead: the **leader's link down** (isolated) for a few seconds;
- a **remove** seen: the leader SIGKILLed and restarted.

Why the drain of an old server: the rebalance alone moves only the idle topic's
partitions (the planner takes the partitions to move in sorted order, and ``idle`` sorts
before the produced topic), so its drain moved nothing that holds acknowledged records,
and the suite could not see a move lose one: with the move bug i27_3 back (leadership
handed to a new replica before it is in sync) it stayed green. The old server drained is
picked by dry runs (``old_to_drain``): the one whose plan hands a produced partition's
leadership to a replica its move adds, the case i27_3 needs; the test asserts that such a
handover was planned (``MovesResult.planned_handovers``; the job lines that show it done,
``loaded_handovers``, are printed: a coordinator killed before it published its last
second of lines loses them), so a planner change cannot make it toothless again unseen.

Faults come one at a time, each ended (healed, restarted) before the next is armed. After
the jobs end (each run again while moves are left: a rollback, a job that lost its owner),
the exactly-once checker reads the whole log and compares it with every acknowledgement;
the replicas must be in sync, within one of even, and each partition's replicas
byte-identical.

``python -m tests.chaos.netns_moves [--long]`` runs it from the command line (as root);
tests/chaos/test_netns_moves.py is the short form CI runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the chaos suite's flat modules

from checker import Acked, CheckReport, check, read_topic
from netns_cluster import NetCluster
from netns_suite import IDLE_TOPIC, PARTITIONS, PRODUCERS, TOPIC, AckAt, Load, netns_cluster

from coordinator.rebalance import leader_loads, replica_loads, spread
from pidlease.testing.devcluster import http_json
from pidlease.testing.netns import Network, unavailable
from pidlease.wire.cluster import PartitionState, partition_path

NEW = 4  # the server that joins
CUT_S = 3.0
DOWN_S = 1.0
JOB_MAX_S = 240.0
RUNS_MAX = 4  # rebalance asked again while moves are left (bounded)
ROUNDS_MAX = 4  # rounds (rebalance, two drains) while faults are left (bounded)
# The move throttle low (above the topic's write rate, about 15 KB/s a partition here),
# so a move's catch-up lasts and the throttle itself is under the nemesis. Its
# bucket holds one second of the rate: a log of twice that cannot be fetched in one
# burst, so the old server's drain waits (at most LOADED_WAIT_S) for the produced
# partitions to hold LOADED_BYTES: a new replica of one is then behind for about a second,
# far longer than the mover's poll (0.2 s), and a move that hands it leadership before it
# is in sync (i27_3) loses acknowledged records. (A smaller log fits in the first burst:
# the new replica was in sync before the mover's next poll and the bug went unseen. The
# rate trades the wait for the logs to grow against the later moves' catch-ups of the
# grown logs: 256 KiB/s waited about 25 s, 64 KiB/s made the drains take 3 minutes.)
MOVE_BYTES_PER_S = 128 * 1024
LOADED_BYTES = 2 * MOVE_BYTES_PER_S
LOADED_WAIT_S = 30.0
# A follower out of sync within seconds, as in the suite's short form.
SERVER_ENV = {
    "PIDLEASE_REPLICA_LAG_TIME_MAX_MS": "4000",
    "PIDLEASE_PREFERRED_LEADER_SETTLE_MS": "1000",
    "PIDLEASE_MOVE_FETCH_BYTES_PER_S": str(MOVE_BYTES_PER_S),
}


@dataclass
class Fault:
    on: str  # the move step it waits for: "add" | "lead" | "remove"
    what: str
    # (network, cluster, the partition's state after the step, the moving replica: the
    # one added, or the one that took the lead)
    act: Callable[[Network, NetCluster, PartitionState, int], None]


def _cut_new_from_leader(net: Network, c: NetCluster, ps: PartitionState, moving: int) -> None:
    net.cut(f"s{moving}", f"s{ps.leader}")
    time.sleep(CUT_S)
    net.heal()
    _restart(c, f"s{moving}")


def _restart(c: NetCluster, name: str, down_s: float = DOWN_S) -> None:
    c.kill(name)
    time.sleep(down_s)
    c.start_proc(c.procs[name])


def _isolate_leader(net: Network, c: NetCluster, ps: PartitionState, moving: int) -> None:
    net.link(f"s{ps.leader}", up=False)
    time.sleep(CUT_S)
    net.heal()


FAULTS = [
    Fault("add", "new replica cut from the leader, then SIGKILLed", _cut_new_from_leader),
    Fault(
        "lead",
        "the moving replica, now leading, SIGKILLed",
        lambda n, c, p, m: _restart(c, f"s{m}"),
    ),
    Fault(
        "add",
        "the coordinator running the job SIGKILLed",
        lambda n, c, p, m: _restart(c, "coordinator"),
    ),
    Fault("lead", "the leader's link down", _isolate_leader),
    Fault(
        "remove",
        "the leader SIGKILLed after a remove",
        lambda n, c, p, m: _restart(c, f"s{p.leader}"),
    ),
]


@dataclass
class MovesResult:
    name: str
    faults: list[str] = field(default_factory=list)  # what was injected, on which partition
    runs: int = 0
    rounds: int = 0
    job_lines: list[str] = field(default_factory=list)
    acked: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    report: CheckReport | None = None
    replicas: dict[int, int] = field(default_factory=dict)
    leaders: dict[int, int] = field(default_factory=dict)
    differ: list[str] = field(default_factory=list)
    took_s: float = 0.0
    trace: list[str] = field(default_factory=list)  # the injector's view of the moves
    # Moves of the produced topic whose new first replica the move adds, as planned by
    # the old servers' drains (what i27_3 needs; see the module docstring).
    planned_handovers: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return "\n".join(
            [
                f"MOVES {self.name}: {self.rounds} round(s), {self.runs} job run(s) in "
                f"{self.took_s:.1f} s, acked "
                f"{self.acked}, failed {self.failed}",
                *(f"  fault: {f}" for f in self.faults),
                f"  replicas per server {self.replicas}, leaders {self.leaders}",
                f"  replicas that differ: {self.differ}",
                *(f"  handover planned: {ln}" for ln in self.planned_handovers),
                *(f"  handed over: {ln}" for ln in loaded_handovers(self.job_lines)),
                *(f"  seen: {t}" for t in self.trace[-60:]),
                f"  {self.report.summary() if self.report else 'no check'}",
            ]
        )


class Injector(threading.Thread):
    """Watches the moves (their records under ``/moves`` and their partitions' states);
    when a move enters the phase the next fault waits for, injects it, then arms the next
    (on a phase entered from then on)."""

    def __init__(self, net: Network, cluster: NetCluster, faults: list[Fault]) -> None:
        super().__init__(daemon=True)
        self.net, self.c, self.faults = net, cluster, list(faults)
        self.done_flag = threading.Event()
        self.injected: list[str] = []
        self.errors: list[str] = []
        self._rec: dict[tuple[str, int], tuple[list[int], list[int]]] = {}  # from, to
        self._phase: dict[tuple[str, int], str | None] = {}
        self.trace: list[str] = []  # every phase change seen (printed by the summary)

    def _records(self) -> dict[tuple[str, int], tuple[list[int], list[int]]]:
        zk = self.c.zk()
        out: dict[tuple[str, int], tuple[list[int], list[int]]] = {}
        for t in zk.get_children("/moves") if zk.exists("/moves") else []:
            for p in zk.get_children(f"/moves/{t}"):
                with contextlib.suppress(Exception):
                    rec = json.loads(zk.get(f"/moves/{t}/{p}")[0])
                    out[(t, int(p))] = (list(rec["from"]), list(rec["to"]))
        return out

    @staticmethod
    def phase(ps: PartitionState, orig: list[int], target: list[int]) -> tuple[str, int] | None:
        """Where a move stands (see ``Fault``), and its moving replica: "add" once a new
        replica is in the list, "lead" once the target's first replica leads (when it
        did not before; also a move that only changes the preferred leader), "remove"
        once the list is the target."""
        added = [r for r in target if r not in orig]
        if ps.replicas == target and target != orig:
            return "remove", ps.leader
        if ps.leader == target[0] != orig[0]:
            return "lead", ps.leader
        if added and any(r in ps.replicas for r in added):
            return "add", added[0]
        return None

    def run(self) -> None:
        deadline = time.monotonic() + JOB_MAX_S * RUNS_MAX * 2
        while self.faults and not self.done_flag.is_set() and time.monotonic() < deadline:
            try:
                recs = self._records()
                self._rec.update(recs)
                for key, (orig, target) in list(self._rec.items()):
                    ps = PartitionState.from_bytes(self.c.zk().get(partition_path(*key))[0])
                    ph = self.phase(ps, orig, target)
                    was = self._phase.get(key)
                    self._phase[key] = ph[0] if ph else None
                    if (ph[0] if ph else None) != was:
                        self.trace.append(
                            f"{time.strftime('%H:%M:%S')} {key[0]}-{key[1]} {orig}->{target}: "
                            f"{was} -> {ph[0] if ph else None} (replicas {ps.replicas}, "
                            f"leader {ps.leader}, in sync {ps.isr})"
                        )
                    if key not in recs:
                        # Ended (done, rolled back): looked at once more, so a remove
                        # whose record went before this poll is still seen; never again
                        # against this record (a later move of it has its own).
                        del self._rec[key]
                        self._phase.pop(key, None)
                    if ph is None or ph[0] == was or ph[0] != self.faults[0].on:
                        continue
                    f = self.faults.pop(0)
                    line = (
                        f"{time.strftime('%H:%M:%S')} {key[0]}-{key[1]} in its {ph[0]} phase "
                        f"(replicas {ps.replicas}, leader {ps.leader}, moving replica "
                        f"{ph[1]}): {f.what}"
                    )
                    print(f"FAULT {line}", flush=True)
                    f.act(self.net, self.c, ps, ph[1])
                    self.injected.append(line)
                    break
            except Exception as exc:  # noqa: BLE001 - ZooKeeper cut for a moment: look again
                self.errors.append(f"{type(exc).__name__}: {exc}")
            time.sleep(0.05)


def _job(url: str, path: str, *, dry_run: bool = False) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:  # the coordinator may be restarting, or the old job still owned
        try:
            status, body = http_json(
                "POST", url + path, {"rollback_after_s": 60, "dry_run": dry_run}
            )
        except OSError:
            status, body = 0, {}
        if status == 200:
            return body
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path}: {status} {body}")
        time.sleep(1.0)


def _wait_job(url: str) -> dict[str, Any]:
    deadline = time.monotonic() + JOB_MAX_S
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            status, st = http_json("GET", url + "/v1/cluster/moves", timeout_s=5)
            if status == 200:
                last = st
                if not st["running"]:
                    return st
        time.sleep(0.5)
    raise TimeoutError(
        f"the moves job ({last.get('kind')}, owner {last.get('owner')}) still running after "
        f"{JOB_MAX_S} s: {last.get('lines')}"
    )


def old_to_drain(url: str, servers: list[int]) -> tuple[int, list[str]]:
    """The one of ``servers`` whose drain (planned by a dry run) hands the most partitions
    of the produced topic to a first replica the move adds (then: moves the most of them;
    then: the lowest id), and those planned handovers."""
    best: tuple[tuple[int, int, int], int, list[str]] | None = None
    for s in servers:
        planned = _job(url, f"/v1/servers/{s}/drain", dry_run=True)["moves"]
        ours = [m for m in planned if m["topic"] == TOPIC]
        hand = [
            f"{TOPIC}-{m['partition']}: {m['from']} -> {m['to']}"
            for m in ours
            if m["to"][0] not in m["from"]
        ]
        score = (len(hand), len(ours), -s)
        if best is None or score > best[0]:
            best = (score, s, hand)
    assert best is not None, "no server to drain"
    return best[1], best[2]


def loaded_handovers(job_lines: list[str]) -> list[str]:
    """The job lines where a move of the produced topic handed leadership to a replica
    that move added (the step i27_3 takes too early)."""
    added: dict[str, set[int]] = {}
    out = []
    for ln in job_lines:
        key, _, rest = ln.partition(": ")
        if not key.startswith(f"{TOPIC}-"):
            continue
        if rest.startswith("move "):
            orig, _, target = rest[len("move ") :].partition(" -> ")
            with contextlib.suppress(ValueError):
                added[key] = set(json.loads(target)) - set(json.loads(orig))
        elif rest.startswith("leadership ") and key in added:
            to = rest[len("leadership ") :].split(" ")[2]
            if to.isdigit() and int(to) in added[key]:
                out.append(ln)
    return out


def _log_sizes(c: NetCluster) -> dict[int, int]:
    """Each produced partition's log size (bytes) on its leader's disk (0: not readable)."""
    out = {}
    for p in range(PARTITIONS):
        try:
            pdir = c.data_dir / f"server-{c.leader(TOPIC, p)}" / "data" / f"{TOPIC}-{p}"
            out[p] = sum(seg.stat().st_size for seg in pdir.glob("*.log"))
        except Exception:  # noqa: BLE001 - ZooKeeper cut, a segment rolled: 0, look again
            out[p] = 0
    return out


def _wait_loaded(c: NetCluster, res: MovesResult) -> None:
    """Wait (at most LOADED_WAIT_S) until every produced partition holds LOADED_BYTES."""
    deadline = time.monotonic() + LOADED_WAIT_S
    sizes = _log_sizes(c)
    while min(sizes.values()) < LOADED_BYTES and time.monotonic() < deadline:
        time.sleep(0.5)
        sizes = _log_sizes(c)
    res.trace.append(f"{time.strftime('%H:%M:%S')} produced logs before the drain: {sizes}")


def _run_job(url: str, path: str, res: MovesResult) -> None:
    """Start a job (again while moves are left, bounded) and wait for its end."""
    for _ in range(RUNS_MAX):
        res.runs += 1
        body = _job(url, path)
        print(f"{path}: {len(body['moves'])} move(s) planned", flush=True)
        if not body["moves"]:
            return
        st = _wait_job(url)
        res.job_lines += st["lines"]
        if st["moves"] and all(m["state"] == "done" for m in st["moves"]):
            return


def run_moves(
    net: Network, cluster: NetCluster, *, rounds: int = 1, load_idx: int = 100
) -> MovesResult:
    """The scenario (see the module docstring) on a started cluster whose topics exist
    (``Suite.setup``) and whose host ``s4`` is free: ``rounds`` times a rebalance onto
    server 4, an old server's drain and server 4's drain, the faults injected once per
    round."""
    res = MovesResult(
        f"rebalance onto a new server, an old one's drain, the new one's (at least {rounds} x)"
    )
    t0 = time.monotonic()
    load = Load(cluster.coordinator_url, load_idx).start()
    inj = Injector(net, cluster, FAULTS * rounds)
    all_acks: list[AckAt] = []
    try:
        time.sleep(2.0)
        cluster.add_server(NEW)
        inj.start()
        # A round: a rebalance onto server 4, an old server's drain (see the module
        # docstring), server 4's drain; more rounds (bounded) while faults are left, for
        # moves quicker than the faults.
        url = cluster.coordinator_url
        for n in range(ROUNDS_MAX):
            if n >= rounds and not inj.faults:
                break
            res.rounds = n + 1
            _run_job(url, "/v1/cluster/rebalance", res)
            _wait_loaded(cluster, res)
            old, hand = old_to_drain(url, [s for s in cluster.server_ids() if s != NEW])
            res.planned_handovers += hand
            _run_job(url, f"/v1/servers/{old}/drain", res)
            _run_job(url, f"/v1/servers/{NEW}/drain", res)
        inj.done_flag.set()
        inj.join(JOB_MAX_S)
        res.faults = inj.injected + [f"(injector retried after: {e})" for e in inj.errors[:3]]
        res.trace = inj.trace + res.trace
    finally:
        inj.done_flag.set()
        load.stop()
    all_acks += load.acks
    res.acked, res.failed = len(load.acks), dict(load.failed)
    res.took_s = time.monotonic() - t0
    servers = [s for s in cluster.server_ids() if s != NEW]  # drained
    _wait_in_sync(cluster)
    assign = _assignment(cluster)
    res.replicas = replica_loads(assign, servers)
    res.leaders = leader_loads({k: [v[0]] for k, v in _leaders(cluster).items()}, servers)
    res.report = check(
        read_topic(cluster.coordinator_url, TOPIC, PARTITIONS),
        [Acked(a.partition, a.pid, a.sequence_id, a.offset) for a in all_acks],
    )
    res.differ = _differ(cluster, assign)
    print(res.summary(), flush=True)
    return res


def _assignment(c: NetCluster) -> dict[tuple[str, int], list[int]]:
    from netns_suite import IDLE_PARTITIONS

    out = {}
    for t, n in ((TOPIC, PARTITIONS), (IDLE_TOPIC, IDLE_PARTITIONS)):
        for p in range(n):
            out[(t, p)] = list(c.partition_state(t, p)[0].replicas)
    return out


def _leaders(c: NetCluster) -> dict[tuple[str, int], list[int]]:
    return {k: [c.leader(*k)] for k in _assignment(c)}


def _wait_in_sync(c: NetCluster, timeout_s: float = 90.0) -> None:
    from netns_suite import IDLE_PARTITIONS

    deadline = time.monotonic() + timeout_s
    states: list[PartitionState] = []
    while time.monotonic() < deadline:
        states = [
            c.partition_state(t, p)[0]
            for t, n in ((TOPIC, PARTITIONS), (IDLE_TOPIC, IDLE_PARTITIONS))
            for p in range(n)
        ]
        if all(sorted(s.isr) == sorted(s.replicas) and s.leader > 0 for s in states):
            return
        time.sleep(0.3)
    raise TimeoutError(f"not in sync after {timeout_s} s: {states}")


def _differ(c: NetCluster, assign: dict[tuple[str, int], list[int]]) -> list[str]:
    """The partitions of the produced topic whose current replicas' logs differ on disk
    (after their log ends agree)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ends = {}
        for p in range(PARTITIONS):
            ends[p] = {len(c.log_bytes(s, TOPIC, p)) for s in assign[(TOPIC, p)]}
        if all(len(v) == 1 for v in ends.values()):
            break
        time.sleep(0.5)
    out = []
    for p in range(PARTITIONS):
        blobs = {c.log_bytes(s, TOPIC, p) for s in assign[(TOPIC, p)]}
        if len(blobs) != 1:
            out.append(f"{TOPIC}-{p}: {len(blobs)} different logs on {assign[(TOPIC, p)]}")
    return out


def verdict(res: MovesResult) -> list[str]:
    """What is wrong (empty: nothing)."""
    bad = []
    if res.report is None or not res.report.ok:
        bad.append("the exactly-once check failed")
    if res.report is not None and (res.report.acked_missing or res.report.duplicated):
        bad.append(f"lost {res.report.acked_missing}, duplicated {res.report.duplicated}")
    if res.acked == 0:
        bad.append("the producers made no progress")
    if spread(res.replicas) > 1:
        bad.append(f"replicas not within one of even: {res.replicas}")
    if res.differ:
        bad.append(f"replicas differ: {res.differ}")
    return bad


def main(argv: list[str] | None = None) -> int:
    from netns_suite import Suite

    ap = argparse.ArgumentParser(prog="python -m tests.chaos.netns_moves")
    ap.add_argument("--long", action="store_true", help="two rounds, the faults in each")
    ap.add_argument("--data-dir", type=Path, default=None)
    args = ap.parse_args(argv)
    why = unavailable()
    if why:
        print(f"cannot run: {why}")
        return 2
    base = args.data_dir or Path(tempfile.mkdtemp(prefix="pidlease-netns-moves-"))
    print(f"data under {base}", flush=True)
    with netns_cluster(base, SERVER_ENV, spare_hosts=1) as (net, cluster):
        suite = Suite(net, cluster, 0.0)
        suite.setup()
        try:
            res = run_moves(net, cluster, rounds=2 if args.long else 1)
        finally:
            suite.teardown()
    bad = verdict(res)
    if not res.planned_handovers:
        bad.append("no move planned to hand a produced partition's leadership to a replica")
    print("OK" if not bad else f"FAILED: {bad}")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "FAULTS",
    "PRODUCERS",
    "SERVER_ENV",
    "MovesResult",
    "loaded_handovers",
    "old_to_drain",
    "run_moves",
    "verdict",
]
