"""The leader's in-sync bookkeeping: the high watermark, when a follower falls out of the
in-sync set and when it may come back, on a fake clock."""

from __future__ import annotations

from partition_server.isr import InSyncReplicas


def test_high_watermark_is_the_smallest_end_among_the_in_sync_set() -> None:
    s = InSyncReplicas(1, [1, 2, 3], [1, 2, 3], now_ms=0)
    assert s.high_watermark(100) == -1  # no follower fetched yet in this leadership
    s.record_fetch(2, 80, 100, 1)
    assert s.high_watermark(100) == -1
    s.record_fetch(3, 90, 100, 1)
    assert s.high_watermark(100) == 80
    assert s.high_watermark(70) == 70  # the leader's own fsynced end bounds it too
    s.set_isr([1, 3])  # 2 left the set: it no longer holds anything back
    assert s.high_watermark(100) == 90


def test_a_follower_being_added_counts_before_zookeeper_says_so() -> None:
    s = InSyncReplicas(1, [1, 2, 3], [1, 2], now_ms=0)
    s.record_fetch(2, 100, 100, 1)
    s.record_fetch(3, 100, 100, 1)
    assert s.joiners(100) == [3]
    s.pending_add.add(3)
    s.record_fetch(3, 100, 130, 2)
    s.record_fetch(2, 130, 130, 2)
    assert s.high_watermark(130) == 100  # 3 holds it back while the write is in flight
    s.set_isr([1, 2, 3])
    assert not s.pending_add and s.high_watermark(130) == 100


def test_joining_needs_the_high_watermark() -> None:
    s = InSyncReplicas(1, [1, 2, 3], [1, 2], now_ms=0)
    s.record_fetch(3, 50, 200, 1)
    assert s.joiners(120) == []
    s.record_fetch(3, 120, 200, 2)
    assert s.joiners(120) == [3]
    assert s.joiners(121) == []


def test_a_follower_that_stops_fetching_lags_out_after_the_lag_time() -> None:
    s = InSyncReplicas(1, [1, 2, 3], [1, 2, 3], now_ms=0)
    s.record_fetch(2, 10, 10, 1000)
    s.record_fetch(3, 10, 10, 1000)
    assert s.laggards(11_000, 10_000) == []
    s.record_fetch(2, 10, 10, 11_500)
    assert s.laggards(11_001, 10_000) == [3]
    s.pending_remove.add(3)
    assert s.laggards(12_000, 10_000) == []  # already being removed


def test_keeping_pace_with_a_busy_leader_counts_as_caught_up() -> None:
    # The leader's end moves on between fetches; a follower whose every fetch reaches the
    # end as it was at its previous fetch is in sync, though never exactly at the end.
    s = InSyncReplicas(1, [1, 2], [1, 2], now_ms=0)
    leader_end = 0
    for t in range(1, 100):
        follower_end = leader_end
        leader_end += 7
        s.record_fetch(2, follower_end, leader_end, t * 1000)
    assert s.laggards(100_000, 10_000) == []
    # one that falls ever further behind is not
    s = InSyncReplicas(1, [1, 2], [1, 2], now_ms=0)
    for t in range(1, 100):
        s.record_fetch(2, t, t * 10, t * 1000)
    assert s.laggards(100_000, 10_000) == [2]


def test_a_follower_that_never_shows_up_gets_one_lag_period() -> None:
    s = InSyncReplicas(1, [1, 2], [1, 2], now_ms=5_000)
    assert s.laggards(15_000, 10_000) == []
    assert s.laggards(15_001, 10_000) == [2]
