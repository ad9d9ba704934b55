"""Replica moves (issue 27): change a partition's replica set under load, one ZooKeeper
compare-and-set per step, so a crash anywhere leaves the partition safe and the move
resumable.

A move is recorded first (``/moves/<topic>/<partition>``: the original and the target
replica lists), then driven by ``next_step`` (pure) from whatever the partition state is
now, so a coordinator that dies mid-move, or another that picks the record up, simply
continues:

1. **Add**: the target's new replicas are appended to ``replicas`` (epoch + 1, leader and
   in-sync set unchanged). Each new replica's server opens the partition, follows the
   leader and fetches from its log start, rebuilding producer state from the log and, when
   the leader's log starts above 0, from the leader's snapshot rows (the follower's
   start-over, as for any follower: docs/replication.md); the leader adds it to the
   in-sync set once it has caught up (its own compare-and-set).
2. **Wait** until every target replica is in the in-sync set.
3. **Lead**: when the leader is not the target's first replica, leadership moves to it
   (it is in sync and live: the election's rules; epoch + 1).
4. **Remove**: ``replicas`` becomes the target, the in-sync set the target's members of it
   (all of the target, after 2), epoch + 1. Only then does any original replica go, so the
   in-sync set never has fewer members than the target's length, never fewer than the
   topic's minimum, because of a move.

Every write bumps the epoch: the leader re-derives its followers and in-sync view from the
state (``become_leader``), and its own in-sync write at the older epoch is refused, so the
two writers never undo each other. A step waits while the leader is not live (the
followers elect first). A move whose target names a server that is not live rolls back:
its target becomes the original list (every original replica is still in ``replicas``
until step 4, which needs every target replica in sync).

``MoveRunner`` drives many moves, a few at a time (``parallel``: the throttle), reporting
each step to a progress callback. docs/operations.md, "Adding, draining and removing
servers".
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from pidlease.wire.cluster import SERVERS, PartitionState, TopicSpec, partition_path, topic_path

log = logging.getLogger("coordinator.moves")

MOVES = "/moves"
Key = tuple[str, int]


def move_path(topic: str, partition: int) -> str:
    return f"{MOVES}/{topic}/{partition}"


@dataclass(frozen=True)
class Step:
    kind: str  # "write" | "wait" | "done"
    why: str
    state: PartitionState | None = None


def next_step(
    ps: PartitionState, target: list[int], live: Collection[int], min_insync: int
) -> Step:
    """The next thing to do to bring ``ps`` to the replica list ``target`` (pure; see the
    module docstring for the order and why it is safe)."""
    if ps.leader not in live:
        return Step("wait", f"leader {ps.leader} is not live (an election comes first)")
    epoch = ps.leader_epoch + 1
    adding = [r for r in target if r not in ps.replicas]
    if adding:
        new = PartitionState(
            replicas=[*ps.replicas, *adding], leader=ps.leader, leader_epoch=epoch, isr=ps.isr
        )
        return Step("write", f"add {adding} as followers", new)
    behind = [r for r in target if r not in ps.isr]
    if behind:
        return Step("wait", f"{behind} catching up")
    if ps.leader != target[0] and target[0] in live:
        new = PartitionState(
            replicas=list(ps.replicas), leader=target[0], leader_epoch=epoch, isr=list(ps.isr)
        )
        return Step("write", f"leadership {ps.leader} -> {target[0]}", new)
    if ps.leader not in target:
        alt = next((r for r in target if r in live), None)
        if alt is None:
            return Step("wait", f"no target replica of {target} is live to lead")
        new = PartitionState(
            replicas=list(ps.replicas), leader=alt, leader_epoch=epoch, isr=list(ps.isr)
        )
        return Step("write", f"leadership {ps.leader} -> {alt}", new)
    if ps.replicas != target:
        isr = [r for r in target if r in ps.isr]
        if len(isr) < max(min_insync, 1):
            return Step("wait", f"in-sync {isr} below the minimum {min_insync}")
        removed = [r for r in ps.replicas if r not in target]
        new = PartitionState(replicas=list(target), leader=ps.leader, leader_epoch=epoch, isr=isr)
        return Step("write", f"remove {removed}" if removed else "reorder", new)
    return Step("done", "in place")


def needs_rollback(target: list[int], original: list[int], live: Collection[int]) -> bool:
    """A target server is not live: go back to the original list (if not there already)."""
    return target != original and any(r not in live for r in target)


@dataclass
class Move:
    key: Key
    original: list[int]
    target: list[int]
    state: str = "running"  # running | done | rolled back | failed
    last: str = ""
    steps: int = 0
    gone_since: float | None = None  # a target server not live since (monotonic s)

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.key[0],
            "partition": self.key[1],
            "from": self.original,
            "to": self.target,
            "state": self.state,
            "last": self.last,
            "steps": self.steps,
        }


class MoveRunner:
    """Drives moves with a kazoo client (blocking; run it in a thread)."""

    def __init__(
        self,
        zk: Any,
        *,
        progress: Callable[[str], None] = lambda line: None,
        parallel: int = 4,
        poll_s: float = 0.2,
        rollback_after_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.zk = zk
        self.rollback_after_s = rollback_after_s
        self.clock = clock  # seconds, monotonic (the simulation's virtual one in tests/sim)
        self.progress = progress
        self.parallel = max(1, parallel)
        self.poll_s = poll_s
        self._min_insync: dict[str, int] = {}

    # -- records ---------------------------------------------------------------------------
    def record(self, key: Key, original: list[int], target: list[int]) -> None:
        data = json.dumps({"from": original, "to": target}).encode()
        path = move_path(*key)
        try:
            self.zk.create(path, data, makepath=True)
        except NodeExistsError:
            self.zk.set(path, data)

    def pending(self) -> dict[Key, tuple[list[int], list[int]]]:
        """The moves recorded and not finished (a coordinator died mid-move)."""
        out: dict[Key, tuple[list[int], list[int]]] = {}
        try:
            topics = self.zk.get_children(MOVES)
        except NoNodeError:
            return out
        for t in topics:
            try:
                parts = self.zk.get_children(f"{MOVES}/{t}")
            except NoNodeError:
                continue
            for p in parts:
                try:
                    raw, _ = self.zk.get(move_path(t, int(p)))
                    rec = json.loads(raw)
                    out[(t, int(p))] = (list(rec["from"]), list(rec["to"]))
                except (NoNodeError, ValueError, KeyError, TypeError):
                    continue
        return out

    def _forget(self, key: Key) -> None:
        with contextlib.suppress(NoNodeError):
            self.zk.delete(move_path(*key))

    # -- driving ---------------------------------------------------------------------------
    def _live(self) -> set[int]:
        return {int(c) for c in self.zk.get_children(SERVERS) if c.isdigit()}

    def _min(self, topic: str) -> int:
        if topic not in self._min_insync:
            raw, _ = self.zk.get(topic_path(topic))
            self._min_insync[topic] = TopicSpec.from_bytes(raw).min_insync
        return self._min_insync[topic]

    def step(self, m: Move) -> bool:
        """One step of ``m``; True when it has ended (done or rolled back)."""
        path = partition_path(*m.key)
        try:
            raw, stat = self.zk.get(path)
        except NoNodeError:
            m.state, m.last = "failed", "the partition is gone (topic deleted)"
            self._forget(m.key)
            return True
        ps = PartitionState.from_bytes(raw)
        live = self._live()
        if needs_rollback(m.target, m.original, live):
            gone = [r for r in m.target if r not in live]
            now = self.clock()
            if m.gone_since is None:
                m.gone_since = now
                self.progress(
                    f"{m.key[0]}-{m.key[1]}: target server(s) {gone} not live; waiting up to "
                    f"{self.rollback_after_s:g} s before rolling back"
                )
            if now - m.gone_since >= self.rollback_after_s:
                self.progress(
                    f"{m.key[0]}-{m.key[1]}: {gone} not live for {now - m.gone_since:.0f} s; "
                    f"rolling back to {m.original}"
                )
                m.target = list(m.original)
                m.state = "rolling back"
                self.record(m.key, m.original, m.target)
        else:
            m.gone_since = None
        s = next_step(ps, m.target, live, self._min(m.key[0]))
        if s.kind == "done":
            m.state = "done" if m.state == "running" else "rolled back"
            m.last = "done"
            self._forget(m.key)
            self.progress(f"{m.key[0]}-{m.key[1]}: {m.state}: replicas {ps.replicas}")
            return True
        if s.kind == "wait":
            if s.why != m.last:
                self.progress(f"{m.key[0]}-{m.key[1]}: waiting: {s.why}")
            m.last = s.why
            return False
        assert s.state is not None
        try:
            self.zk.set(path, s.state.to_bytes(), version=stat.version)
        except BadVersionError:
            return False  # changed since the read (an in-sync change, an election): again
        m.steps += 1
        m.last = s.why
        self.progress(
            f"{m.key[0]}-{m.key[1]}: {s.why} (epoch {s.state.leader_epoch}, replicas "
            f"{s.state.replicas}, leader {s.state.leader}, in sync {s.state.isr})"
        )
        return False

    def run(
        self,
        targets: Mapping[Key, list[int]],
        current: Mapping[Key, list[int]],
        *,
        timeout_s: float,
        stop: Callable[[], bool] = lambda: False,
    ) -> list[Move]:
        """Move every partition of ``targets`` whose replica list differs from ``current``,
        ``parallel`` at a time, until all end or ``timeout_s`` passes (the moves left
        keep their records and resume with the next run)."""
        queue = [
            Move(k, list(current[k]), list(t))
            for k, t in sorted(targets.items())
            if list(current.get(k, [])) != list(t)
        ]
        moves = list(queue)
        active: list[Move] = []
        deadline = time.monotonic() + timeout_s
        while (queue or active) and time.monotonic() < deadline and not stop():
            while queue and len(active) < self.parallel:
                m = queue.pop(0)
                self.record(m.key, m.original, m.target)
                self.progress(f"{m.key[0]}-{m.key[1]}: move {m.original} -> {m.target}")
                active.append(m)
            for m in list(active):
                try:
                    ended = self.step(m)
                except Exception as exc:  # noqa: BLE001 - ZooKeeper trouble: the next round retries
                    log.warning("%s-%d: move step failed: %s", m.key[0], m.key[1], exc)
                    ended = False
                if ended:
                    active.remove(m)
            if active:
                time.sleep(self.poll_s)
        for m in active + queue:
            m.state = "pending"
        return moves


def read_cluster(zk: Any) -> tuple[dict[Key, list[int]], list[int]]:
    """Every partition's replica list, and the live servers (blocking)."""
    current: dict[Key, list[int]] = {}
    for name in zk.get_children("/topics"):
        try:
            parts = zk.get_children(f"{topic_path(name)}/partitions")
        except NoNodeError:
            continue
        for p in parts:
            if not p.isdigit():
                continue
            try:
                raw, _ = zk.get(partition_path(name, int(p)))
            except NoNodeError:
                continue
            current[(name, int(p))] = list(PartitionState.from_bytes(raw).replicas)
    live = sorted(int(c) for c in zk.get_children(SERVERS) if c.isdigit())
    return current, live


class MoveJobs:
    """One rebalance or drain at a time (the coordinator's ``/v1/cluster`` routes): plan
    (``rebalance.plan``), resume the moves a previous run left recorded, then run the
    planned ones in a thread; ``status()`` shows the progress lines and each move."""

    def __init__(self, zk: Any, *, parallel: int = 4, timeout_s: float = 3600.0) -> None:
        import threading

        self.rollback_after_s = 30.0
        self.zk = zk
        self.parallel = parallel
        self.timeout_s = timeout_s
        self.lines: list[str] = []
        self.moves: list[Move] = []
        self.kind = ""
        self.running = False
        self.error = ""
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def _note(self, line: str) -> None:
        log.info("%s", line)
        with self._lock:
            self.lines.append(line)
            del self.lines[:-2000]

    def plan(self, drain: Collection[int] = ()) -> dict[str, Any]:
        from coordinator.rebalance import leader_loads, plan, replica_loads

        current, live = read_cluster(self.zk)
        for key, (_, target) in MoveRunner(self.zk).pending().items():
            if key in current:
                current[key] = list(target)  # resumed first: plan from where it ends
        holding = {r for reps in current.values() for r in reps}
        unknown = sorted(set(drain) - set(live) - holding)
        if unknown:
            from pidlease.errors import InvalidRequest

            raise InvalidRequest(
                f"server(s) {unknown} are neither live nor hold a replica; live: {live}"
            )
        targets = plan(current, live, drain)
        eligible = sorted(set(live) - set(drain))
        return {
            "live": live,
            "drain": sorted(drain),
            "moves": [
                {"topic": k[0], "partition": k[1], "from": current[k], "to": t}
                for k, t in sorted(targets.items())
                if t != current[k]
            ],
            "replicas_before": replica_loads(current, live),
            "replicas_after": replica_loads(targets, eligible),
            "leaders_after": leader_loads(targets, eligible),
            "_targets": targets,
            "_current": current,
        }

    def start(
        self,
        kind: str,
        drain: Collection[int] = (),
        *,
        dry_run: bool,
        rollback_after_s: float = 30.0,
    ) -> dict[str, Any]:
        import threading

        from coordinator.rebalance import PlanError
        from pidlease.errors import InvalidRequest

        with self._lock:
            if self.running:
                raise InvalidRequest(f"a {self.kind} is running; see GET /v1/cluster/moves")
        try:
            p = self.plan(drain)
        except PlanError as exc:
            raise InvalidRequest(f"no plan: {exc}") from exc
        targets, current = p.pop("_targets"), p.pop("_current")
        p["dry_run"] = dry_run
        if dry_run:
            return p
        with self._lock:
            if self.running:
                raise InvalidRequest(f"a {self.kind} is running; see GET /v1/cluster/moves")
            self.running, self.kind, self.error = True, kind, ""
            self.rollback_after_s = rollback_after_s
            self.lines, self.moves = [], []
        self._thread = threading.Thread(
            target=self._run, args=(targets, current), name="moves", daemon=True
        )
        self._thread.start()
        return p

    def _run(self, targets: dict[Key, list[int]], current: dict[Key, list[int]]) -> None:
        runner = MoveRunner(
            self.zk,
            progress=self._note,
            parallel=self.parallel,
            rollback_after_s=self.rollback_after_s,
        )
        try:
            pending = runner.pending()
            if pending:
                self._note(f"resuming {len(pending)} move(s) a previous run left")
                done = runner.run(
                    {k: t for k, (_, t) in pending.items()},
                    {k: o for k, (o, _) in pending.items()},
                    timeout_s=self.timeout_s,
                )
                self.moves.extend(done)
                # the resumed ones may have changed what the plan started from
                current, _ = read_cluster(self.zk)
            todo = {k: t for k, t in targets.items() if k in current}
            self._note(f"{sum(1 for k, t in todo.items() if t != current[k])} move(s) to run")
            self.moves.extend(runner.run(todo, current, timeout_s=self.timeout_s))
            left = [m for m in self.moves if m.state == "pending"]
            back = [m for m in self.moves if m.state == "rolled back"]
            if left:
                self._note(f"{len(left)} move(s) left pending; they resume with the next run")
            elif back:
                self._note(f"{len(back)} move(s) rolled back; run {self.kind} again")
            else:
                self._note(f"{self.kind} done")
        except Exception as exc:  # noqa: BLE001 - reported in the status
            self.error = f"{type(exc).__name__}: {exc}"
            self._note(f"{self.kind} failed: {self.error}")
        finally:
            with self._lock:
                self.running = False

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "kind": self.kind,
                "running": self.running,
                "failure": self.error,
                "lines": list(self.lines),
                "moves": [m.to_json() for m in self.moves],
            }
