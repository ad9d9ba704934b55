"""The leader's view of its followers: how far each has fetched, which are in sync, and the
high watermark that follows from it. Pure: no I/O, the clock is passed in.

Rules (Kafka's, simplified to one fetch per partition):

- A follower's fetch offset is its log end, every byte below it fsynced (the follower
  fsyncs before it fetches again), so it is what the follower holds durably.
- The high watermark is the smallest log end among the in-sync replicas, the leader's own
  fsynced end included. A record is acked (and readable) only below it. A follower whose
  log end is not known yet (no fetch since this leadership began) holds it back.
- Acked means held by every in-sync replica, and a new leader comes only from the in-sync
  set, so shrinking the set never loses an acked record. Growing it must be as careful: a
  follower counts towards the high watermark from the moment the leader decides to add it,
  before the ZooKeeper write lands (``pending_add``), so nothing is acked that it lacks
  while ZooKeeper may already name it in sync.
- A failed write changes nothing it may have changed (a lost connection can land it
  after all): removals are forgotten and found again by the next check, additions keep
  counting and are asked again (``change_failed``). Only a write ZooKeeper confirmed
  (``set_isr``) lets a follower stop counting.
- Lagging: a follower is caught up when a fetch reaches the leader's log end as it was at
  that fetch, or at its previous fetch (a follower that keeps pace with a busy leader is
  never exactly at the end). One not caught up for ``lag_ms`` leaves the set.
- Joining: a follower outside the set joins once its log end reaches the high watermark
  and the leader's log end at the start of its leadership (``epoch_start``): then it holds
  everything that is acked. The high watermark alone is not enough after a failover: the
  new leader may have learnt less of it than the old one acked (its own high watermark
  lags by a fetch), and what the old leader may have acked is everything every in-sync
  replica held, so everything below the new leader's log end when it took over (Kafka's
  rule too). Without it (simulation seed 501223) a follower that had started over, empty,
  at the new leader's high watermark rejoined below an acked batch, was elected when the
  leader died, and the batch was lost. Only a fetch that arrived after the leader
  decided to remove it counts (``fetches_at_removal``): the log end it reported before is
  stale, and on an idle partition it equals the high watermark for ever, so an unreachable
  follower would be re-admitted on its old fetch and removed again every tick. Joining
  counts as being caught up (it holds everything acked): it gets a full lag period from
  the fetch that let it in, not one removal tick later.
- Rate: after a change, no addition is asked for ``min_interval_ms`` (the leader's
  setting ``isr_change_min_interval_ms``); removals are never delayed by it (a removal
  ends a stall of the acks; it is limited already, as a follower leaves at most once per
  ``lag_ms`` after it was caught up). docs/replication.md, "The in-sync set".
- Departed: a follower whose ``/servers/<id>`` znode is gone (its ZooKeeper session ended:
  killed, or cut off for longer than the session timeout) leaves the set at once, without
  waiting ``lag_ms`` (``departed``; ``liveness.py`` decides which servers are gone). It is
  the same removal as a laggard's, so the same safety holds, and it returns the same way,
  by a fetch since its removal.
- Minimum in-sync replicas (the topic's ``min_insync``): a write is accepted only while
  ZooKeeper's set (leader included) has at least that many members
  (``accepts_writes``), and the high watermark moves only while at least that many
  replicas are counted (``commits``): nothing is acked on fewer copies, even a batch
  appended while the set was big enough. ``counted`` includes the set, so a write
  accepted can always be committed while the set stays as it is.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass


@dataclass
class FollowerProgress:
    end_offset: int = -1  # -1: not known yet in this leadership
    last_fetch_ms: int = 0
    leader_end_at_last_fetch: int = 0
    last_caught_up_ms: int = 0
    fetches: int = 0  # fetches received in this leadership
    fetches_at_removal: int = 0  # ``fetches`` when the leader last decided to remove it


class InSyncReplicas:
    def __init__(
        self,
        leader: int,
        replicas: list[int],
        isr: list[int],
        now_ms: int,
        min_insync: int = 1,
        epoch_start: int = 0,
    ) -> None:
        self.leader = leader
        self.epoch_start = epoch_start  # the leader's log end when this leadership began
        self.min_insync = min_insync
        self.replicas = list(replicas)
        self.isr: set[int] = set(isr) | {leader}
        self.pending_add: set[int] = set()  # counted; ZooKeeper has not confirmed them
        self.pending_remove: set[int] = set()  # a write removing them is in flight
        self.retry_add: set[int] = set()  # pending additions whose write failed
        self.last_change_ms: int | None = None  # the last write decided in this leadership
        # ``laggards``' answer is none up to this time, for this lag (None: not known): an
        # idle leader's check of thousands of partitions each tick costs a comparison each.
        self._no_laggard_until: tuple[int, float] | None = None
        # A follower gets a full lag period from the start of this leadership to show up.
        self.followers = {
            r: FollowerProgress(last_caught_up_ms=now_ms) for r in replicas if r != leader
        }

    def record_fetch(self, follower: int, end_offset: int, leader_end: int, now_ms: int) -> None:
        p = self.followers.get(follower)
        if p is None:
            return
        if end_offset >= leader_end:
            if now_ms < p.last_caught_up_ms:
                self._no_laggard_until = None  # a clock set back (tests): look again
            p.last_caught_up_ms = now_ms
        elif end_offset >= p.leader_end_at_last_fetch and p.last_fetch_ms:
            p.last_caught_up_ms = max(p.last_caught_up_ms, p.last_fetch_ms)
        p.end_offset = end_offset
        p.last_fetch_ms = now_ms
        p.fetches += 1
        p.leader_end_at_last_fetch = leader_end

    def counted(self) -> set[int]:
        """Replicas whose log end bounds the high watermark."""
        return self.isr | self.pending_add

    def accepts_writes(self) -> bool:
        """Enough replicas in ZooKeeper's in-sync set for the leader to take a write."""
        return len(self.isr) >= self.min_insync

    def commits(self) -> bool:
        """Enough replicas counted for the high watermark to move."""
        return len(self.counted()) >= self.min_insync

    def high_watermark(self, leader_flushed_end: int) -> int:
        hw = leader_flushed_end
        for r in self.counted():
            if r == self.leader:
                continue
            p = self.followers.get(r)
            end = p.end_offset if p is not None else -1
            hw = min(hw, end)
        return hw

    def laggards(self, now_ms: int, lag_ms: int) -> list[int]:
        """Counted followers not caught up for ``lag_ms``: to be removed. A pending
        addition counts too: one whose write failed and that then died must not hold the
        high watermark back for ever.

        When there are none, none can appear before the oldest candidate's last catch-up
        plus ``lag_ms``: a follower's ``last_caught_up_ms`` only grows, and whatever changes
        the candidates (``begin_change``, ``change_failed``, ``set_isr``) forgets that
        time, so until then the answer is the same without looking."""
        quiet = self._no_laggard_until
        if quiet is not None and quiet[0] == lag_ms and now_ms <= quiet[1]:
            return []
        candidates = [
            (r, self.followers[r])
            for r in self.counted() - self.pending_remove
            if r != self.leader and r in self.followers
        ]
        out = sorted(r for r, p in candidates if now_ms - p.last_caught_up_ms > lag_ms)
        if not out:
            oldest = min((p.last_caught_up_ms for _, p in candidates), default=None)
            self._no_laggard_until = (
                lag_ms,
                float("inf") if oldest is None else oldest + lag_ms,
            )
        return out

    def departed(self, gone: Collection[int]) -> list[int]:
        """Counted followers in ``gone`` (their ZooKeeper session ended): to be removed
        now. Like a laggard, a pending addition counts, and one already being removed is
        left to that write."""
        return sorted(
            r
            for r in self.counted() - self.pending_remove
            if r != self.leader and r in self.followers and r in gone
        )

    def joiners(self, high_watermark: int, now_ms: int = 0, min_interval_ms: int = 0) -> list[int]:
        """Followers outside the set whose log end, reported by a fetch since the leader
        decided to remove them, has reached the high watermark and ``epoch_start`` (again,
        when the write adding them failed). None within ``min_interval_ms`` of the last
        change."""
        if self.followers.keys() <= self.isr:
            return []  # every follower is in the set: the idle case, without a pass
        if self.last_change_ms is not None and now_ms - self.last_change_ms < min_interval_ms:
            return []
        return sorted(
            r
            for r, p in self.followers.items()
            if r not in self.isr
            and (r not in self.pending_add or r in self.retry_add)
            and p.fetches > p.fetches_at_removal
            and p.end_offset >= 0
            and p.end_offset >= max(high_watermark, self.epoch_start)
        )

    def begin_change(self, add: list[int], remove: list[int], now_ms: int = 0) -> list[int]:
        """The leader decided to write a new set: returns it. ``add`` counts towards the
        high watermark from now on, before ZooKeeper may name it in sync, and is caught up
        as of the fetch that let it in. ``remove`` needs a new fetch to come back."""
        self.last_change_ms = now_ms
        self._no_laggard_until = None
        for r in add:
            p = self.followers[r]
            p.last_caught_up_ms = max(p.last_caught_up_ms, p.last_fetch_ms)
        for r in remove:
            p = self.followers[r]
            p.fetches_at_removal = p.fetches
        self.pending_add |= set(add)
        self.retry_add -= set(add)
        self.pending_remove |= set(remove)
        return sorted((self.isr | set(add)) - set(remove))

    def change_failed(self) -> None:
        """The write failed, or its outcome is unknown. Removals are dropped so the next
        check finds those laggards again (they still count meanwhile: safe whatever
        ZooKeeper holds). Additions keep counting, since ZooKeeper may name them in sync
        now, and become joiners again so the write is retried."""
        self.pending_remove.clear()
        self.retry_add |= self.pending_add
        self._no_laggard_until = None

    def set_isr(self, isr: list[int]) -> None:
        """ZooKeeper now says ``isr``, after our write (one at a time): a follower being
        removed that it does not name stops counting, even one still pending addition."""
        self._no_laggard_until = None
        self.isr = set(isr) | {self.leader}
        self.pending_add -= self.isr | self.pending_remove
        self.retry_add &= self.pending_add
        self.pending_remove &= self.isr

    def lag_report(self, now_ms: int) -> dict[int, dict[str, int]]:
        return {
            r: {"end_offset": p.end_offset, "ms_since_caught_up": now_ms - p.last_caught_up_ms}
            for r, p in sorted(self.followers.items())
        }
