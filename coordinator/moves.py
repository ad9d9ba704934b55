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
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from pidlease.errors import InvalidRequest
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
        into: list[Move] | None = None,
    ) -> list[Move]:
        """Move every partition of ``targets`` whose replica list differs from ``current``,
        ``parallel`` at a time, until all end, ``timeout_s`` passes or ``stop()`` is true
        (the moves left keep their records and resume with the next run). ``into`` gets
        the moves at once (a status shows them while they run)."""
        queue = [
            Move(k, list(current[k]), list(t))
            for k, t in sorted(targets.items())
            if list(current.get(k, [])) != list(t)
        ]
        moves = list(queue)
        if into is not None:
            into.extend(moves)
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


JOB = "/jobs/moves"  # the cluster's one rebalance or drain job (persistent: its spec, progress)
JOB_OWNER = "/jobs/moves-owner"  # ephemeral: the coordinator running it, while it lives
JOB_LINES_MAX = 500  # progress lines kept in the job node (the last ones)
JOB_PUBLISH_S = 1.0  # the owner writes its progress to the job node at most this often


class JobRunning(InvalidRequest):
    """A rebalance or drain is already running somewhere in the cluster (409)."""

    http_status = 409


class MoveJobs:
    """The cluster's one rebalance or drain at a time (the coordinator's ``/v1/cluster``
    routes), whichever coordinator is asked.

    A job is claimed in one ZooKeeper transaction: the job node ``/jobs/moves`` (kind,
    drained servers, settings, progress) set to running at the version read as not
    running, and the ephemeral ``/jobs/moves-owner`` created with this coordinator's id.
    A second request, to any coordinator, finds the job running and gets ``JobRunning``
    (409) naming it and where to follow it; ``status()`` on any coordinator shows the
    owner's progress (the owner writes it to the job node about once a second).

    When the owner dies its ephemeral node goes with its session; every coordinator
    looks about once a second (``JOB_PUBLISH_S``, or ``takeover_poll_s`` when shorter),
    and the first to create the owner node again (in a transaction with the job node's
    version) takes the job over: it plans again for
    the same kind and drained servers, from where the moves are (the moves recorded under
    ``/moves`` resume first, ``MoveRunner.pending``). An owner that finds the owner node
    gone or someone else's (its session expired) stops driving moves at once; every move
    step is a compare-and-set, so two drivers for a moment are safe, only wasteful.

    The job itself: plan (``rebalance.plan``), resume the moves a previous run left
    recorded, then run the planned ones in a thread."""

    def __init__(
        self,
        zk: Any,
        *,
        coordinator_id: str = "coordinator",
        parallel: int = 4,
        timeout_s: float = 3600.0,
        takeover_poll_s: float = 2.0,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.rollback_after_s = 30.0
        self.zk = zk
        self.me = coordinator_id
        self.parallel = parallel
        self.timeout_s = timeout_s
        self.takeover_poll_s = takeover_poll_s
        self.clock_ms = clock_ms
        self.lines: list[str] = []
        self.moves: list[Move] = []
        self.kind = ""
        self.drain: list[int] = []
        self.started_ms = 0
        self.running = False
        # Set once this coordinator's claim of the job (the owner node) is in ZooKeeper:
        # ``start`` sets ``running`` before it claims, and the watcher's tick in between
        # found no owner node, took the job for lost and stranded it (running and owned in
        # ZooKeeper, nothing moving, every new job refused; the netns moves suite's long
        # form hung on it twice).
        self.claimed = False
        self.error = ""
        self.takeovers = 0
        self._dropped0 = 0  # the job's lines dropped before ``lines[0]`` (the CLI counts them)
        self._lost = threading.Event()  # this coordinator no longer owns the job it runs
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._published = (-1, -1)

    # -- the watcher: publish progress, notice a lost ownership, take over a dead owner's --
    def start_watching(self) -> None:
        self._watcher = threading.Thread(target=self._watch, name="moves-jobs", daemon=True)
        self._watcher.start()

    def stop_watching(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)

    def _watch(self) -> None:
        while not self._stop.wait(min(JOB_PUBLISH_S, self.takeover_poll_s)):
            try:
                self.tick()
            except Exception as exc:  # noqa: BLE001 - ZooKeeper away: the next tick retries
                log.debug("moves job watcher: %s", exc)

    def tick(self) -> None:
        """One look (the watcher thread's; tests call it directly)."""
        if self.running:
            if not self.claimed:
                return  # ``start`` is claiming it: no owner node yet, and none lost
            if not self._owner_is_me():
                if not self._lost.is_set():
                    self._note(f"{self.me} no longer owns the {self.kind}: stopping")
                self._lost.set()
                return
            self._publish(final=False)
            return
        self.take_over()

    def _owner_is_me(self) -> bool:
        try:
            raw, _ = self.zk.get(JOB_OWNER)
        except NoNodeError:
            return False
        return bool(raw.decode(errors="replace") == self.me)

    def _read_job(self) -> tuple[dict[str, Any], Any] | None:
        try:
            raw, stat = self.zk.get(JOB)
        except NoNodeError:
            return None
        try:
            job = json.loads(raw)
        except ValueError:
            job = {}
        return (job if isinstance(job, dict) else {}), stat

    def take_over(self) -> bool:
        """Take the running job of a coordinator that died (its owner node gone); True
        when this coordinator now runs it."""
        got = self._read_job()
        if got is None or not got[0].get("running") or self.zk.exists(JOB_OWNER):
            return False
        job, stat = got
        was = job.get("owner", "?")
        line = (
            f"{self.me} takes over the {job.get('kind', 'job')} of {was} (its owner node is gone)"
        )
        job = {**job, "owner": self.me, "lines": [*job.get("lines", []), line][-JOB_LINES_MAX:]}
        if not self._claim(job, stat.version):
            return False
        self.claimed = True
        self.takeovers += 1
        log.warning("%s", line)
        drain = [int(x) for x in job.get("drain", [])]
        with self._lock:
            self.running, self.kind, self.error = True, str(job.get("kind", "rebalance")), ""
            self.drain, self.started_ms = drain, int(job.get("started_ms", self.clock_ms()))
            self.rollback_after_s = float(job.get("rollback_after_s", 30.0))
            self.lines, self.moves = list(job["lines"]), []
            self._dropped0 = int(job.get("lines_dropped", 0))
            self._lost.clear()
        self._thread = threading.Thread(
            target=self._run, args=(None, None), name="moves", daemon=True
        )
        self._thread.start()
        return True

    def _claim(self, job: dict[str, Any], version: int | None) -> bool:
        """Set the job node (at ``version``; None: create it) and create the owner node,
        in one transaction; False when another got there first."""
        with contextlib.suppress(NodeExistsError):
            self.zk.ensure_path("/jobs")
        t = self.zk.transaction()
        data = json.dumps(job).encode()
        if version is None:
            t.create(JOB, data)
        else:
            t.set_data(JOB, data, version=version)
        t.create(JOB_OWNER, self.me.encode(), ephemeral=True)
        results = t.commit()
        return not any(isinstance(r, Exception) for r in results)

    def _job_json(self, *, running: bool) -> dict[str, Any]:
        with self._lock:
            lines = self.lines[-JOB_LINES_MAX:]
            return {
                "kind": self.kind,
                "drain": self.drain,
                "rollback_after_s": self.rollback_after_s,
                "started_ms": self.started_ms,
                "owner": self.me,
                "running": running,
                "failure": self.error,
                "lines": lines,
                "lines_dropped": self._dropped0 + max(0, len(self.lines) - len(lines)),
                "moves": [m.to_json() for m in self.moves],
            }

    def _publish(self, *, final: bool) -> None:
        """Write the progress to the job node (the owner only); the final write also
        deletes the owner node, in the same transaction."""
        mark = (len(self.lines), sum(m.steps for m in self.moves))
        if not final and mark == self._published:
            return
        data = json.dumps(self._job_json(running=not final)).encode()
        if final:
            t = self.zk.transaction()
            t.set_data(JOB, data)
            t.delete(JOB_OWNER)
            results = t.commit()
            if any(isinstance(r, Exception) for r in results):
                log.warning("the moves job's end not recorded: %s", results)
        else:
            self.zk.set(JOB, data)
        self._published = mark

    # -- running ---------------------------------------------------------------------------
    def _note(self, line: str) -> None:
        log.info("%s", line)
        with self._lock:
            self.lines.append(line)
            over = len(self.lines) - 2000
            if over > 0:
                del self.lines[:over]
                self._dropped0 += over

    def plan(self, drain: Collection[int] = ()) -> dict[str, Any]:
        from coordinator.rebalance import leader_loads, plan, replica_loads

        current, live = read_cluster(self.zk)
        for key, (_, target) in MoveRunner(self.zk).pending().items():
            if key in current:
                current[key] = list(target)  # resumed first: plan from where it ends
        holding = {r for reps in current.values() for r in reps}
        unknown = sorted(set(drain) - set(live) - holding)
        if unknown:
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

    def _refuse_running(self) -> None:
        got = self._read_job()
        if got is not None and got[0].get("running"):
            job = got[0]
            raise JobRunning(
                f"a {job.get('kind', 'job')} is running, on coordinator {job.get('owner', '?')}; "
                "follow it with GET /v1/cluster/moves (on any coordinator) and ask again "
                "once it has ended",
                job={k: job.get(k) for k in ("kind", "owner", "drain", "started_ms")},
            )

    def start(
        self,
        kind: str,
        drain: Collection[int] = (),
        *,
        dry_run: bool,
        rollback_after_s: float = 30.0,
    ) -> dict[str, Any]:
        from coordinator.rebalance import PlanError

        if not dry_run:
            self._refuse_running()
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
                raise JobRunning(f"a {self.kind} is running here; see GET /v1/cluster/moves")
            self.running, self.kind, self.error = True, kind, ""
            self.claimed = False
            self.drain, self.started_ms = sorted(drain), self.clock_ms()
            self.rollback_after_s = rollback_after_s
            self.lines, self.moves = [], []
            self._dropped0 = 0
            self._lost.clear()
        try:
            got = self._read_job()
            if got is not None and got[0].get("running"):
                claimed = False
            else:
                claimed = self._claim(
                    self._job_json(running=True), None if got is None else got[1].version
                )
        except BaseException:
            with self._lock:
                self.running = False
            raise
        if not claimed:
            with self._lock:
                self.running = False
            self._refuse_running()
            raise JobRunning("another coordinator started a job at the same moment; ask again")
        self.claimed = True
        p["owner"] = self.me
        self._thread = threading.Thread(
            target=self._run, args=(targets, current), name="moves", daemon=True
        )
        self._thread.start()
        return p

    def _run(
        self, targets: dict[Key, list[int]] | None, current: dict[Key, list[int]] | None
    ) -> None:
        from coordinator.rebalance import PlanError

        runner = MoveRunner(
            self.zk,
            progress=self._note,
            parallel=self.parallel,
            rollback_after_s=self.rollback_after_s,
        )
        stop = self._lost.is_set
        try:
            pending = runner.pending()
            if pending:
                self._note(f"resuming {len(pending)} move(s) a previous run left")
                runner.run(
                    {k: t for k, (_, t) in pending.items()},
                    {k: o for k, (o, _) in pending.items()},
                    timeout_s=self.timeout_s,
                    stop=stop,
                    into=self.moves,
                )
            if targets is None and not stop():  # taken over: plan again, from here
                try:
                    p = self.plan(self.drain)
                except PlanError as exc:
                    raise RuntimeError(f"no plan: {exc}") from exc
                targets = p["_targets"]
            current, _ = read_cluster(self.zk)  # the resumed ones may have moved things
            todo = {k: t for k, t in (targets or {}).items() if k in current}
            if not stop():
                n = sum(1 for k, t in todo.items() if t != current[k])
                self._note(f"{n} move(s) to run")
                runner.run(todo, current, timeout_s=self.timeout_s, stop=stop, into=self.moves)
            left = [m for m in self.moves if m.state == "pending"]
            back = [m for m in self.moves if m.state == "rolled back"]
            if stop():
                self._note(f"{len(left)} move(s) left to the coordinator that owns the job now")
            elif left:
                self._note(f"{len(left)} move(s) left pending; they resume with the next run")
            elif back:
                self._note(f"{len(back)} move(s) rolled back; run {self.kind} again")
            else:
                self._note(f"{self.kind} done")
        except Exception as exc:  # noqa: BLE001 - reported in the status
            self.error = f"{type(exc).__name__}: {exc}"
            self._note(f"{self.kind} failed: {self.error}")
        finally:
            if not self._lost.is_set():
                try:
                    self._publish(final=True)
                except Exception as exc:  # noqa: BLE001 - the owner node goes with the session
                    log.warning("the moves job's end not recorded: %s", exc)
            with self._lock:
                self.running = False

    def status(self) -> dict[str, Any]:
        """This coordinator's job while it runs one; else the cluster's job as its owner
        last wrote it (running elsewhere, or ended)."""
        if not self.running:
            try:
                got = self._read_job()
            except Exception:  # noqa: BLE001 - ZooKeeper away: what this one knows
                got = None
            if got is not None and got[0]:
                job = got[0]
                return {
                    "kind": job.get("kind", ""),
                    "running": bool(job.get("running")),
                    "owner": job.get("owner", ""),
                    "failure": job.get("failure", ""),
                    "lines": list(job.get("lines", [])),
                    "lines_dropped": int(job.get("lines_dropped", 0)),
                    "moves": list(job.get("moves", [])),
                }
        with self._lock:
            return {
                "kind": self.kind,
                "running": self.running,
                "owner": self.me if self.kind else "",
                "failure": self.error,
                "lines": list(self.lines),
                "lines_dropped": self._dropped0,
                "moves": [m.to_json() for m in self.moves],
            }
