"""The leader's in-sync bookkeeping: the high watermark, when a follower falls out of the
in-sync set and when it may come back, on a fake clock."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

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


def idle_leader_with_a_dead_follower() -> InSyncReplicas:
    """An idle partition (log end 10, everything acked): follower 3 fetched up to the end
    once, then became unreachable; follower 2 keeps fetching."""
    s = InSyncReplicas(1, [1, 2, 3], [1, 2, 3], now_ms=0)
    s.record_fetch(2, 10, 10, 1_000)
    s.record_fetch(3, 10, 10, 1_000)
    return s


def test_an_unreachable_follower_removed_from_an_idle_partition_stays_out() -> None:
    # Its last fetch reported the log end, which on an idle partition is the high
    # watermark for ever: that old fetch must not let it back in (the flapping of issue 16).
    s = idle_leader_with_a_dead_follower()
    lag = 10_000
    now = 1_000 + lag + 1
    s.record_fetch(2, 10, 10, now)
    assert s.laggards(now, lag) == [3]
    s.set_isr(s.begin_change([], [3], now))
    assert s.isr == {1, 2}
    for t in range(now, now + 60_000, 500):  # a minute of 2's fetches and maintenance ticks
        s.record_fetch(2, 10, 10, t)
        assert s.joiners(s.high_watermark(10), t, 1_000) == [], t
        assert s.laggards(t, lag) == []


def test_a_removed_follower_rejoins_after_a_fetch_that_reaches_the_high_watermark() -> None:
    s = idle_leader_with_a_dead_follower()
    s.set_isr(s.begin_change([], [3], 12_000))
    s.record_fetch(3, 7, 10, 20_000)  # back, but behind
    assert s.joiners(s.high_watermark(10), 20_000, 1_000) == []
    s.record_fetch(3, 10, 10, 20_500)
    assert s.joiners(s.high_watermark(10), 20_500, 1_000) == [3]
    s.set_isr(s.begin_change([3], [], 20_500))
    assert s.isr == {1, 2, 3}
    # joining counts as caught up: a full lag period from the fetch that let it in
    assert 3 not in s.laggards(20_500 + 10_000, 10_000)


def test_a_joiner_behind_a_busy_leader_gets_a_lag_period_before_it_can_leave() -> None:
    # Reaching the high watermark without reaching the leader's end: without the lag
    # clock restarting at the join, the next maintenance tick would remove it again.
    s = InSyncReplicas(1, [1, 2, 3], [1, 2], now_ms=0)
    s.record_fetch(3, 100, 130, 50_000)  # HW 100 (2's end), leader end 130
    s.record_fetch(2, 100, 130, 50_000)
    assert s.joiners(s.high_watermark(130), 50_000, 1_000) == [3]
    s.set_isr(s.begin_change([3], [], 50_000))
    assert 3 not in s.laggards(51_000, 10_000)


def test_additions_wait_the_minimum_interval_after_a_change_and_removals_do_not() -> None:
    s = InSyncReplicas(1, [1, 2, 3], [1, 2, 3], now_ms=0)
    s.record_fetch(2, 10, 10, 100)
    s.record_fetch(3, 10, 10, 100)
    s.set_isr(s.begin_change([], [3], 20_000))
    s.record_fetch(3, 10, 10, 20_100)  # back at once
    assert s.joiners(10, 20_100, 1_000) == []
    assert s.joiners(10, 20_999, 1_000) == []
    assert s.joiners(10, 21_000, 1_000) == [3]
    assert s.joiners(10, 20_100, 0) == [3]  # 0: no limit
    s.set_isr(s.begin_change([3], [], 21_000))
    # 2 stops fetching: its removal is due whatever the last change, and not held back
    assert s.laggards(20_101, 20_000) == [2]


def test_joining_needs_the_leaders_log_end_at_the_start_of_its_epoch() -> None:
    # A new leader whose log ends at 57 but whose high watermark (learnt as a follower)
    # is 56: the old leader may have acked 56. A follower at 56 holds the high watermark
    # but not 56; it joins at 57 (simulation seed 501223).
    s = InSyncReplicas(3, [1, 2, 3], [3], now_ms=0, min_insync=2, epoch_start=57)
    s.record_fetch(1, 56, 57, 1)
    assert s.joiners(56) == []
    s.record_fetch(1, 57, 58, 2)
    assert s.joiners(56) == [1]
    # past the epoch's start, the high watermark is the bar again
    s = InSyncReplicas(3, [1, 2, 3], [3], now_ms=0, epoch_start=57)
    s.record_fetch(1, 60, 80, 1)
    assert s.joiners(70) == []
    s.record_fetch(1, 70, 80, 2)
    assert s.joiners(70) == [1]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "remove"]),
            st.sampled_from([2, 3]),
            st.sampled_from(["written", "lost", "written but lost"]),
        ),
        max_size=12,
    )
)
def test_whoever_zookeeper_may_name_in_sync_is_counted(steps: list[tuple[str, int, str]]) -> None:
    """Review 5 (docs/reliability.md finding 5): a failed in-sync-set write to ZooKeeper was
    never retried.

    The pure rule under any run of writes that succeed, fail, or fail after landing:
    the leader counts every follower ZooKeeper names in sync, and a failed change is left
    to be found again (no removal stuck pending, every pending addition retryable)."""
    s = InSyncReplicas(1, [1, 2, 3], [1, 2, 3], now_ms=0)
    zk = {1, 2, 3}
    for kind, r, result in steps:
        if kind == "add" and r in s.isr:
            continue  # the leader adds only followers outside the set
        if kind == "remove" and r not in s.counted() - s.pending_remove:
            continue  # ... and removes only counted ones
        new = s.begin_change([r] if kind == "add" else [], [r] if kind == "remove" else [])
        assert zk - {1} <= s.counted()  # while the write is in flight
        if result != "lost":
            zk = set(new)
        if result == "written":
            s.set_isr(new)
        else:
            s.change_failed()
            assert not s.pending_remove and s.pending_add <= s.retry_add
        assert zk - {1} <= s.counted()


def test_departed_names_counted_followers_only() -> None:
    """Issue 16 (follower loss): a follower whose ZooKeeper session ended leaves the in-sync
    set at once; these are the followers to remove."""

    s = InSyncReplicas(1, [1, 2, 3, 4], [1, 2, 3], now_ms=0)
    s.pending_add.add(4)  # being added: counted, so it must go too
    assert s.departed({1, 2, 4, 9}) == [2, 4]  # never the leader, never a non-replica
    s.pending_remove.add(2)
    assert s.departed({2, 3}) == [3]  # 2 is being removed already
    assert s.departed(set()) == []


def test_isr_rules_count_the_confirmed_set_for_writes_and_the_counted_for_commits() -> None:
    """min_insync_replicas (docs/replication.md): writes count the confirmed in-sync set,
    commits the counted one."""

    isr = InSyncReplicas(1, [1, 2, 3], [1], now_ms=0, min_insync=2)
    assert not isr.accepts_writes() and not isr.commits()
    isr.begin_change([2], [])  # a joiner counts for the HW before ZooKeeper confirms it
    assert isr.commits() and not isr.accepts_writes()
    isr.set_isr([1, 2])
    assert isr.accepts_writes() and isr.commits()


def reference_laggards(s: InSyncReplicas, now_ms: int, lag_ms: int) -> list[int]:
    """The lag rule as docs/replication.md states it: a counted follower, not being
    removed already, not caught up for longer than ``lag_ms``."""
    return sorted(
        r
        for r, p in s.followers.items()
        if r in s.counted() and r not in s.pending_remove and now_ms - p.last_caught_up_ms > lag_ms
    )


def reference_joiners(s: InSyncReplicas, hw: int, now_ms: int, min_interval_ms: int) -> list[int]:
    """Joining (docs/replication.md): outside the set (or an addition to ask again), a
    fetch since its removal that reached the high watermark and the epoch's start, and
    not within ``min_interval_ms`` of the last change."""
    if s.last_change_ms is not None and now_ms - s.last_change_ms < min_interval_ms:
        return []
    return sorted(
        r
        for r, p in s.followers.items()
        if r not in s.isr
        and (r not in s.pending_add or r in s.retry_add)
        and p.fetches > p.fetches_at_removal
        and p.end_offset >= 0
        and p.end_offset >= max(hw, s.epoch_start)
    )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                ["fetch", "fetch", "fetch", "check", "remove", "add", "written", "lost"]
            ),
            st.sampled_from([2, 3, 4]),
            # ms the clock moves: often just to, or just past, a lag period's end
            st.one_of(st.sampled_from([0, 1, 99, 100, 101, 999, 1000]), st.integers(0, 3000)),
            st.integers(0, 20),  # the follower's offset / the leader's end
        ),
        max_size=40,
    ),
    st.sampled_from([100, 1000]),
)
def test_the_remembered_quiet_time_answers_as_the_rule_does(
    steps: list[tuple[str, int, int, int]], lag_ms: int
) -> None:
    """Issue 24 (an idle server costs nothing whatever its partition count): ``laggards``
    remembers until when no follower can lag, ``joiners`` answers at once when everyone
    is in the set. Under any run of fetches, checks and in-sync writes (confirmed or
    lost), both answer what the rule, computed afresh, says at every step."""
    now = 0
    s = InSyncReplicas(1, [1, 2, 3, 4], [1, 2, 3], now_ms=now, epoch_start=5)
    leader_end = 5
    pending: list[int] | None = None
    for kind, r, dt, n in steps:
        now += dt
        if kind == "fetch":
            leader_end = max(leader_end, n)
            s.record_fetch(r, min(n, leader_end), leader_end, now)
        elif kind in ("remove", "add") and pending is None:
            if kind == "remove" and r in s.counted() - s.pending_remove:
                pending = s.begin_change([], [r], now)
            elif kind == "add" and r not in s.isr:
                pending = s.begin_change([r], [], now)
        elif kind in ("written", "lost") and pending is not None:
            if kind == "written":
                s.set_isr(pending)
            else:
                s.change_failed()
            pending = None
        assert s.laggards(now, lag_ms) == reference_laggards(s, now, lag_ms), (kind, now)
        hw = s.high_watermark(leader_end)
        assert s.joiners(hw, now, 500) == reference_joiners(s, hw, now, 500), (kind, now)
