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
- Lagging: a follower is caught up when a fetch reaches the leader's log end as it was at
  that fetch, or at its previous fetch (a follower that keeps pace with a busy leader is
  never exactly at the end). One not caught up for ``lag_ms`` leaves the set.
- Joining: a follower outside the set joins once its log end reaches the high watermark:
  then it holds everything that is acked.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FollowerProgress:
    end_offset: int = -1          # -1: not known yet in this leadership
    last_fetch_ms: int = 0
    leader_end_at_last_fetch: int = 0
    last_caught_up_ms: int = 0


class InSyncReplicas:
    def __init__(self, leader: int, replicas: list[int], isr: list[int], now_ms: int) -> None:
        self.leader = leader
        self.replicas = list(replicas)
        self.isr: set[int] = set(isr) | {leader}
        self.pending_add: set[int] = set()
        self.pending_remove: set[int] = set()
        # A follower gets a full lag period from the start of this leadership to show up.
        self.followers = {r: FollowerProgress(last_caught_up_ms=now_ms)
                          for r in replicas if r != leader}

    def record_fetch(self, follower: int, end_offset: int, leader_end: int, now_ms: int) -> None:
        p = self.followers.get(follower)
        if p is None:
            return
        if end_offset >= leader_end:
            p.last_caught_up_ms = now_ms
        elif end_offset >= p.leader_end_at_last_fetch and p.last_fetch_ms:
            p.last_caught_up_ms = max(p.last_caught_up_ms, p.last_fetch_ms)
        p.end_offset = end_offset
        p.last_fetch_ms = now_ms
        p.leader_end_at_last_fetch = leader_end

    def counted(self) -> set[int]:
        """Replicas whose log end bounds the high watermark."""
        return self.isr | self.pending_add

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
        """In-sync followers not caught up for ``lag_ms``: to be removed."""
        return sorted(r for r in self.isr - self.pending_remove
                      if r != self.leader and r in self.followers
                      and now_ms - self.followers[r].last_caught_up_ms > lag_ms)

    def joiners(self, high_watermark: int) -> list[int]:
        """Followers outside the set whose log end has reached the high watermark."""
        return sorted(r for r, p in self.followers.items()
                      if r not in self.isr and r not in self.pending_add
                      and p.end_offset >= 0 and p.end_offset >= high_watermark)

    def set_isr(self, isr: list[int]) -> None:
        """ZooKeeper now says ``isr`` (after our write, or read back)."""
        self.isr = set(isr) | {self.leader}
        self.pending_add -= self.isr
        self.pending_remove &= self.isr

    def lag_report(self, now_ms: int) -> dict[int, dict[str, int]]:
        return {r: {"end_offset": p.end_offset, "ms_since_caught_up": now_ms - p.last_caught_up_ms}
                for r, p in sorted(self.followers.items())}
