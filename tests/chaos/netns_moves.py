"""Replica moves under the nemesis (issue 27 item 5), on namespace hosts (netns_cluster.py):
producers pipeline into the suite's topic while a fourth server joins and the coordinator
runs ``rebalance`` onto it (and, in the long form, drains it again), and a fault is
injected at each step of the moves as they are seen in ZooKeeper:

- a move's **add** step (the new replica catching up): the new replica cut from the
  partition's leader for a few seconds, then SIGKILLed and restarted;
- its **lead** step (the new replica leads): the new leader, the moving replica, SIGKILLed
  and restarted (an election among the old replicas meanwhile);
- the next add: the **coordinator** running the job SIGKILLed and restarted (the job is
  taken over once its owner node is gone: coordinator/moves.py ``MoveJobs``);
- the next lead: the **leader's link down** (isolated) for a few seconds;
- a **remove** step seen: the leader SIGKILLed and restarted.

Faults come one at a time, each ended (healed, restarted) before the next is armed. After
the job ends (run again while moves are left: a rollback, a job that lost its owner), the
exactly-once checker reads the whole log and compares it with every acknowledgement; the
replicas must be in sync, within one of even, and each partition's replicas
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
# Short ZooKeeper sessions for the servers: a killed one's replicas leave the in-sync set
# within seconds, as in the suite's short form.
SERVER_ENV = {
    "PIDLEASE_REPLICA_LAG_TIME_MAX_MS": "4000",
    "PIDLEASE_PREFERRED_LEADER_SETTLE_MS": "1000",
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
    job_lines: list[str] = field(default_factory=list)
    acked: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    report: CheckReport | None = None
    replicas: dict[int, int] = field(default_factory=dict)
    leaders: dict[int, int] = field(default_factory=dict)
    differ: list[str] = field(default_factory=list)
    took_s: float = 0.0

    def summary(self) -> str:
        return "\n".join(
            [
                f"MOVES {self.name}: {self.runs} job run(s) in {self.took_s:.1f} s, acked "
                f"{self.acked}, failed {self.failed}",
                *(f"  fault: {f}" for f in self.faults),
                f"  replicas per server {self.replicas}, leaders {self.leaders}",
                f"  replicas that differ: {self.differ}",
                f"  {self.report.summary() if self.report else 'no check'}",
            ]
        )


class Injector(threading.Thread):
    """Watches every partition's state; when one is seen at the step the next fault waits
    for (its move record present), injects it, then arms the next."""

    def __init__(self, net: Network, cluster: NetCluster, faults: list[Fault]) -> None:
        super().__init__(daemon=True)
        self.net, self.c, self.faults = net, cluster, list(faults)
        self.done_flag = threading.Event()
        self.injected: list[str] = []
        self.errors: list[str] = []
        self._seen: dict[tuple[str, int], PartitionState] = {}

    def _moving(self) -> dict[tuple[str, int], list[int]]:
        zk = self.c.zk()
        out: dict[tuple[str, int], list[int]] = {}
        for t in zk.get_children("/moves") if zk.exists("/moves") else []:
            for p in zk.get_children(f"/moves/{t}"):
                with contextlib.suppress(Exception):
                    out[(t, int(p))] = list(json.loads(zk.get(f"/moves/{t}/{p}")[0])["to"])
        return out

    @staticmethod
    def _step_of(
        old: PartitionState | None, new: PartitionState, target: list[int]
    ) -> tuple[str, int] | None:
        """The move step between two states, and the moving replica (see ``Fault``)."""
        if old is None or new.leader_epoch == old.leader_epoch:
            return None
        added = [r for r in new.replicas if r not in old.replicas]
        if added:
            return "add", added[0]
        if len(new.replicas) < len(old.replicas):
            return "remove", new.leader
        if new.leader != old.leader and new.leader == target[0]:
            return "lead", new.leader
        return None

    def run(self) -> None:
        deadline = time.monotonic() + JOB_MAX_S * RUNS_MAX
        while self.faults and not self.done_flag.is_set() and time.monotonic() < deadline:
            try:
                moving = self._moving()
                for key, target in moving.items():
                    raw, _ = self.c.zk().get(partition_path(*key))
                    ps = PartitionState.from_bytes(raw)
                    step = self._step_of(self._seen.get(key), ps, target)
                    self._seen[key] = ps
                    if self.faults and step is not None and step[0] == self.faults[0].on:
                        f = self.faults.pop(0)
                        tp = f"{key[0]}-{key[1]}"
                        line = (
                            f"{time.strftime('%H:%M:%S')} {tp} after its {step[0]} step "
                            f"(replicas {ps.replicas}, leader {ps.leader}, moving replica "
                            f"{step[1]}): {f.what}"
                        )
                        print(f"FAULT {line}", flush=True)
                        f.act(self.net, self.c, ps, step[1])
                        self.injected.append(line)
                        self._seen.clear()  # the next fault: on a step seen from now on
                        break
                for key in list(self._seen):
                    if key not in moving:
                        del self._seen[key]
            except Exception as exc:  # noqa: BLE001 - ZooKeeper cut for a moment: look again
                self.errors.append(f"{type(exc).__name__}: {exc}")
            time.sleep(0.05)


def _job(url: str, path: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:  # the coordinator may be restarting, or the old job still owned
        try:
            status, body = http_json("POST", url + path, {"rollback_after_s": 60})
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
    raise TimeoutError(f"the moves job still running after {JOB_MAX_S} s: {last.get('lines')}")


def run_moves(
    net: Network, cluster: NetCluster, *, drain_after: bool = False, load_idx: int = 100
) -> MovesResult:
    """The scenario (see the module docstring) on a started cluster whose topics exist
    (``Suite.setup``) and whose host ``s4`` is free."""
    res = MovesResult("rebalance onto a new server" + (", then its drain" if drain_after else ""))
    t0 = time.monotonic()
    load = Load(cluster.coordinator_url, load_idx).start()
    inj = Injector(net, cluster, FAULTS * (2 if drain_after else 1))
    all_acks: list[AckAt] = []
    try:
        time.sleep(2.0)
        cluster.add_server(NEW)
        inj.start()
        jobs = [("/v1/cluster/rebalance", lambda reps: NEW in reps)]
        if drain_after:
            jobs.append((f"/v1/servers/{NEW}/drain", lambda reps: NEW not in reps))
        for path, _ in jobs:
            for _ in range(RUNS_MAX):
                res.runs += 1
                body = _job(cluster.coordinator_url, path)
                print(f"{path}: {len(body['moves'])} move(s) planned", flush=True)
                if not body["moves"]:
                    break
                st = _wait_job(cluster.coordinator_url)
                res.job_lines += st["lines"]
                if st["moves"] and all(m["state"] == "done" for m in st["moves"]):
                    break
        inj.done_flag.set()
        inj.join(JOB_MAX_S)
        res.faults = inj.injected + [f"(injector retried after: {e})" for e in inj.errors[:3]]
    finally:
        inj.done_flag.set()
        load.stop()
    all_acks += load.acks
    res.acked, res.failed = len(load.acks), dict(load.failed)
    res.took_s = time.monotonic() - t0
    servers = [s for s in cluster.server_ids() if not (drain_after and s == NEW)]
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
    ap.add_argument("--long", action="store_true", help="also drain the new server again")
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
            res = run_moves(net, cluster, drain_after=args.long)
        finally:
            suite.teardown()
    bad = verdict(res)
    print("OK" if not bad else f"FAILED: {bad}")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["FAULTS", "PRODUCERS", "SERVER_ENV", "MovesResult", "run_moves", "verdict"]
