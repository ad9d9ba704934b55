"""Elasticity in the simulation (issue 27): the paths that change who leads or holds a
partition on purpose, each of which makes a replica rebuild producer state from the log
(and, past retention, from its leader's snapshot rows), with the exactly-once checker
after, as for every run:

- **Controlled shutdown**: SIGTERM runs the real ``PartitionServer.stop()`` (which hands
  every partition it leads to an in-sync follower first, ``partition_server/handoff.py``),
  then the process exits and restarts later; its files are then cut as after a crash (what
  the clean stop did not fsync is at risk, as on a power loss after it).
- **Preferred-leader election**: on in these seeds with a short settle time, so a
  restarted preferred replica takes its partitions back during the run.
- **Replica moves**: the coordinator's ``MoveRunner`` steps (``coordinator/moves.py``:
  add, wait in sync, move leadership, remove; each a compare-and-set) on its own
  ZooKeeper session, driven on the virtual clock; the coordinator "crashes" after a
  random number of steps and a later one resumes the move from its record under
  ``/moves``; a new replica whose server stays down rolls the move back. The servers'
  crashes, cuts and ZooKeeper faults keep coming meanwhile.

It draws from its own random stream (the seed's, salted), so a seed without elasticity
runs exactly as before this module existed; ``ELASTIC_P`` of the seeds with more than one
server have it. ``PIDLEASE_SIM_ELASTIC=1`` (or ``0``) forces it on (off).
"""

from __future__ import annotations

import asyncio
import contextvars
import random
from typing import TYPE_CHECKING, Any

from coordinator.moves import Move, MoveRunner
from pidlease.wire.cluster import PartitionState, partition_path
from tests.sim.loop import NODE

if TYPE_CHECKING:
    from tests.sim.world import World

ELASTIC_P = 0.35
HORIZON_S = 0.4


class Elastic:
    def __init__(self, w: World, mode: bool | None = None) -> None:
        self.w = w
        self.rng = random.Random(w.seed * 1_000_003 + 27)
        self.mode = mode
        self.on = False
        self.moves_started = 0
        self.moves_ended = 0
        self.driving: set[tuple[str, int]] = set()  # one driver per partition

    def plan(self) -> None:
        w, rng = self.w, self.rng
        draw = rng.random()
        self.on = (self.mode if self.mode is not None else draw < ELASTIC_P) and w.n_servers > 1
        if not self.on:
            return
        plan: dict[str, Any] = {}
        settle = rng.choice([0, 5, 30])
        w.server_opts["preferred_leader_settle_ms"] = settle
        w.server_opts["controlled_shutdown_timeout_ms"] = rng.choice([50, 200])
        plan["preferred_settle_ms"] = settle
        for _ in range(rng.choice([0, 1, 1, 2])):
            t = rng.uniform(0.01, HORIZON_S)
            sid = rng.randint(1, w.n_servers)
            plan.setdefault("sigterms", []).append((round(t * 1000), sid))
            w.world_later(t, self._terminate, sid)
        for _ in range(rng.choice([1, 2, 3])):
            t = rng.uniform(0.005, HORIZON_S)
            crash_after = rng.choice([None, None, 0, 1, 2, 3])
            plan.setdefault("moves", []).append((round(t * 1000), crash_after))
            w.pending += 1
            w.world_later(t, self._start_move, crash_after)
        w.result.plan["elastic"] = plan

    # -- SIGTERM -------------------------------------------------------------------------------
    def _terminate(self, sid: int) -> None:
        w = self.w
        s = w.servers[sid]
        if w.final or not s.up or s.node is None or not s.node.alive or s.server is None:
            return
        node, srv = s.node, s.server
        w.count("sigterm")
        w.trace("fault", f"SIGTERM {node.name} (controlled shutdown)")
        ctx = contextvars.copy_context()
        ctx.run(NODE.set, node)

        async def stop() -> None:
            try:
                await srv.stop()
            except Exception as exc:  # noqa: BLE001 - a failed stop is still an exit
                w.trace("server", f"{node.name} stop failed: {type(exc).__name__}: {exc}")
            if s.node is node and node.alive:
                s.crash("exit after SIGTERM", restart=not w.final)

        w.loop.create_task(stop(), context=ctx)

    # -- moves ---------------------------------------------------------------------------------
    def _candidates(self) -> list[tuple[tuple[str, int], list[int]]]:
        out = []
        for name, spec in sorted(self.w.topics.items()):
            for p in range(spec.partitions):
                z = self.w.zk.nodes.get(partition_path(name, p))
                if z is None or not z.data:
                    continue
                ps = PartitionState.from_bytes(z.data)
                if len(ps.replicas) >= 2:
                    out.append(((name, p), list(ps.replicas)))
        return out

    def _target(self, replicas: list[int]) -> list[int]:
        """A new replica list of the same length: one replica swapped for a server not in
        it when there is one, and an order that often names another leader."""
        rng = self.rng
        servers = list(range(1, self.w.n_servers + 1))
        out = list(replicas)
        spare = [s for s in servers if s not in out]
        if spare and rng.random() < 0.8:
            out[rng.randrange(len(out))] = rng.choice(spare)
        rng.shuffle(out)
        return out

    def _runner(self) -> MoveRunner:
        w = self.w
        zkc = w.zk.client("mover")
        return MoveRunner(
            zkc,
            progress=lambda line: w.trace("move", line),
            rollback_after_s=self.rng.choice([0.05, 0.2]),
            clock=w.loop.time,
        )

    def _start_move(self, crash_after: int | None) -> None:
        w = self.w
        cands = self._candidates()
        if w.final or not cands:
            w.pending -= 1
            return
        cands = [c for c in cands if c[0] not in self.driving]
        if not cands:
            w.pending -= 1
            return
        key, replicas = self.rng.choice(cands)
        target = self._target(replicas)
        if target == replicas:
            w.pending -= 1
            return
        w.count("move")
        self.moves_started += 1
        w.trace("fault", f"move {key[0]}-{key[1]}: {replicas} -> {target}")
        runner = self._runner()
        try:
            runner.record(key, replicas, target)
        except Exception as exc:  # noqa: BLE001 - ZooKeeper failing: no move
            w.trace("move", f"{key[0]}-{key[1]}: recording failed ({exc}); no move")
            w.pending -= 1
            return
        w.loop.create_task(
            self._drive(runner, Move(key, replicas, target), crash_after),
            context=w.world_ctx,
        )

    async def _drive(self, runner: MoveRunner, m: Move, crash_after: int | None) -> None:
        w = self.w
        self.driving.add(m.key)
        try:
            for _ in range(400):
                if w.final:
                    return
                if crash_after is not None and m.steps >= crash_after:
                    w.count("mover_crash")
                    w.trace("fault", f"coordinator crash after {m.steps} step(s) of {m.key}")
                    w.pending += 1
                    w.world_later(self.rng.uniform(0.01, 0.1), self._resume)
                    return
                try:
                    ended = runner.step(m)
                except Exception as exc:  # noqa: BLE001 - ConnectionLoss: the next step retries
                    w.trace("move", f"{m.key[0]}-{m.key[1]}: step failed: {exc}")
                    ended = False
                if ended:
                    self.moves_ended += 1
                    return
                await asyncio.sleep(self.rng.uniform(0.002, 0.02))
            w.trace("move", f"{m.key[0]}-{m.key[1]}: still {m.last!r} after 400 steps; left")
        finally:
            self.driving.discard(m.key)
            w.pending -= 1

    def _resume(self) -> None:
        """A new coordinator: every recorded move resumes from its record."""
        w = self.w
        if w.final:
            w.pending -= 1
            return
        runner = self._runner()
        try:
            pending = runner.pending()
        except Exception as exc:  # noqa: BLE001 - ZooKeeper failing: try again a bit later
            w.trace("move", f"resume: reading the records failed ({exc}); again later")
            w.world_later(0.02, self._resume)
            return
        pending = {k: v for k, v in pending.items() if k not in self.driving}
        w.trace("move", f"resume: {len(pending)} recorded move(s)")
        w.pending += len(pending)
        for key, (original, target) in sorted(pending.items()):
            self.driving.add(key)
            w.loop.create_task(
                self._drive(runner, Move(key, original, target), None), context=w.world_ctx
            )
        w.pending -= 1
