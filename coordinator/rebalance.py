"""Planning a rebalance or a drain (issue 27): pure, no I/O.

``plan(current, servers, drain=...)`` takes each partition's replica list (the first is the
preferred leader) and the servers that may hold replicas, and returns the replica lists to
move to, so that every eligible server holds an even share of the replicas and of the
preferred leaderships (within one of the mean), moving as few replicas as it can:

1. Keep every replica on an eligible server (a drained or gone server is not eligible).
2. Give each partition that lost replicas the least loaded eligible servers it lacks.
3. While the most and least loaded servers differ by more than one, move one replica of a
   partition the most loaded holds and the least loaded lacks (one always exists: the
   most loaded holds more partitions than the least loaded shares with it). Each such
   move lowers the sum of squared loads, so this ends.
4. Leaders: keep the current first replica when it is still there, else take the replica
   leading fewest. Then, while the leader counts differ by more than one, walk a chain of
   switches (A leads a partition B holds, B leads one C holds, ...) from a most loaded
   server to a least loaded one, found breadth first, and switch along it: every server
   on the chain but the ends keeps its count.

Partitions with one replica are never moved (the servers move only replicated partitions:
docs/operations.md) but count in the loads. The moves themselves are ``moves.py``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping

Key = tuple[str, int]
STEPS_MAX = 1_000_000  # a bound on the improvement loops (never reached: each step helps)


class PlanError(ValueError):
    """No plan is possible (a partition needs more replicas than eligible servers, a
    drained server holds an unmovable single replica)."""


def replica_loads(assign: Mapping[Key, list[int]], servers: Iterable[int]) -> dict[int, int]:
    load = dict.fromkeys(servers, 0)
    for reps in assign.values():
        for r in reps:
            if r in load:
                load[r] += 1
    return load


def leader_loads(assign: Mapping[Key, list[int]], servers: Iterable[int]) -> dict[int, int]:
    load = dict.fromkeys(servers, 0)
    for reps in assign.values():
        if reps and reps[0] in load:
            load[reps[0]] += 1
    return load


def spread(load: Mapping[int, int]) -> int:
    """Most minus least loaded (0 with no server)."""
    return max(load.values()) - min(load.values()) if load else 0


def plan(
    current: Mapping[Key, list[int]], servers: Iterable[int], drain: Iterable[int] = ()
) -> dict[Key, list[int]]:
    """The replica list of every partition after the rebalance (first = preferred
    leader). Raises PlanError when none is possible."""
    drained = set(drain)
    eligible = sorted(set(servers) - drained)
    if not eligible:
        raise PlanError("no server is left to hold replicas")
    fixed = {k for k, reps in current.items() if len(reps) < 2}
    for k in sorted(fixed):
        if current[k] and current[k][0] not in eligible:
            raise PlanError(
                f"{k[0]}-{k[1]} has one replica, on server {current[k][0]}, which is not "
                "eligible: a single replica is not moved"
            )
    out: dict[Key, list[int]] = {}
    for k, reps in current.items():
        if len(set(reps)) > len(eligible) and k not in fixed:
            raise PlanError(
                f"{k[0]}-{k[1]} has {len(set(reps))} replicas; only {len(eligible)} "
                "servers may hold them"
            )
        kept: list[int] = []
        for r in reps:
            if r in eligible and r not in kept:
                kept.append(r)
        out[k] = kept
    load = replica_loads(out, eligible)
    # 2. fill
    for k in sorted(out):
        want = len(set(current[k]))
        while len(out[k]) < want:
            r = min((s for s in eligible if s not in out[k]), key=lambda s: (load[s], s))
            out[k].append(r)
            load[r] += 1
    # 3. even the replicas
    movable = sorted(k for k in out if k not in fixed)
    for _ in range(STEPS_MAX):
        hi = max(eligible, key=lambda s: (load[s], -s))
        lo = min(eligible, key=lambda s: (load[s], s))
        if load[hi] - load[lo] <= 1:
            break
        pick = next((k for k in movable if hi in out[k] and lo not in out[k]), None)
        if pick is None:
            break  # only single replicas left there: as even as they allow
        reps = out[pick]
        reps[reps.index(hi)] = lo  # the leader slot moves with it: step 4 decides anyway
        load[hi] -= 1
        load[lo] += 1
    # 4. leaders
    first = {k: (current[k][0] if current[k] else None) for k in out}
    lead = dict.fromkeys(eligible, 0)
    leader: dict[Key, int] = {}
    for k in sorted(out):
        reps = out[k]
        if not reps:
            continue
        f = first[k]
        chosen = f if f is not None and f in reps else min(reps, key=lambda s: (lead[s], s))
        leader[k] = chosen
        lead[chosen] += 1
    for _ in range(STEPS_MAX):
        if not _even_leaders_once(out, fixed, leader, lead, eligible):
            break
    for k, reps in out.items():
        if k in leader and reps[0] != leader[k]:
            reps.remove(leader[k])
            reps.insert(0, leader[k])
    return out


def _even_leaders_once(
    out: Mapping[Key, list[int]],
    fixed: set[Key],
    leader: dict[Key, int],
    lead: dict[int, int],
    eligible: list[int],
) -> bool:
    """One chain of leader switches from a most to a least loaded server; False when the
    counts are within one or no chain exists."""
    hi_n, lo_n = max(lead.values()), min(lead.values())
    if hi_n - lo_n <= 1:
        return False
    # Breadth first from every most loaded server; an edge a -> b is a partition a leads
    # that b holds (a movable one).
    starts = [s for s in eligible if lead[s] == hi_n]
    prev: dict[int, tuple[int, Key] | None] = dict.fromkeys(starts)
    queue = deque(starts)
    by_leader: dict[int, list[Key]] = {}
    for k in sorted(leader):
        if k not in fixed:
            by_leader.setdefault(leader[k], []).append(k)
    end = None
    while queue:
        a = queue.popleft()
        if lead[a] <= hi_n - 2:
            end = a
            break
        for k in by_leader.get(a, []):
            for b in out[k]:
                if b not in prev:
                    prev[b] = (a, k)
                    queue.append(b)
    if end is None:
        return False
    node = end
    while prev[node] is not None:
        entry = prev[node]
        assert entry is not None
        a, k = entry
        leader[k] = node
        node = a
    lead[node] -= 1
    lead[end] += 1
    return True
