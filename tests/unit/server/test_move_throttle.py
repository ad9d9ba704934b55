"""The move throttle's bytes/s budget (partition_server/move_throttle.py) on a made-up
clock: what a moving replica may read, when it must wait, that the rate over time is the
setting's whatever the read sizes, and which followers count as moving."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from partition_server.move_throttle import MoveThrottle, is_moving


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_only_a_replica_out_of_sync_on_a_partition_mid_move_is_moving() -> None:
    assert is_moving([1, 2, 3, 4], [1, 2, 3], 3, 4)  # the new replica, catching up
    assert not is_moving([1, 2, 3, 4], [1, 2, 3, 4], 3, 4)  # caught up
    assert not is_moving([1, 2, 3, 4], [1, 2, 3], 3, 2)  # an in-sync one
    assert not is_moving([1, 2, 3], [1, 2], 3, 3)  # a restarted follower, no move


def test_an_empty_bucket_makes_a_moving_fetch_wait_for_the_refill() -> None:
    clock = Clock()
    th = MoveThrottle(1000, clock=clock)
    assert th.allowance(4000) == 1000  # one second of the rate at most
    th.spent(1500)  # a whole batch may overshoot
    assert th.allowance(10) == 0 and th.wait_s() == 0.501
    clock.t = 0.501
    assert th.allowance(4000) == 1 and th.wait_s() == 0.0
    assert th.throttled_bytes == 1500


def test_zero_is_no_throttle() -> None:
    th = MoveThrottle(0, clock=Clock())
    assert not th.enabled and th.allowance(123) == 123 and th.wait_s() == 0.0
    th.spent(10**9)
    assert th.allowance(5) == 5


@settings(max_examples=200, deadline=None)
@given(
    st.integers(100, 10**6),
    st.lists(st.tuples(st.integers(1, 3 * 10**6), st.integers(1, 64 * 1024)), min_size=1),
)
def test_the_rate_holds_over_time_whatever_the_reads(
    rate: int, reads: list[tuple[int, int]]
) -> None:
    """A fetcher that reads what it is allowed (at least its first whole batch), waiting
    when told: the bytes sent by time T never exceed rate * T + one second's burst + one
    batch's overshoot."""
    clock = Clock()
    th = MoveThrottle(rate, clock=clock)
    sent = 0
    for ask, batch in reads:
        clock.t += th.wait_s()
        room = max(1, th.allowance(ask))
        got = max(min(ask, room), min(ask, batch))
        th.spent(got)
        sent += got
        assert sent <= rate * clock.t + rate + 64 * 1024
