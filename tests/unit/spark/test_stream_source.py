"""The planning rules of the streaming source (``pidlease.spark.stream_source``): where a
micro-batch ends and how it is cut into tasks, against what the docstrings promise."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from hypothesis import given
from hypothesis import strategies as st

from pidlease.spark.errors import OptionError, PipelineError
from pidlease.spark.stream_source import (
    StreamRange,
    StreamReadSettings,
    dump_offsets,
    next_end,
    parse_offsets,
    plan_ranges,
)

partitions = st.integers(1, 6)


@st.composite
def positions(draw: st.DrawFn) -> tuple[dict[int, int], dict[int, int]]:
    """(start, high watermarks): watermarks at or above start, or -1 (unknown)."""
    n = draw(partitions)
    start = {p: draw(st.integers(0, 50)) for p in range(n)}
    marks = {
        p: draw(st.one_of(st.just(-1), st.integers(start[p], start[p] + 100))) for p in range(n)
    }
    return start, marks


@given(positions(), st.one_of(st.none(), st.integers(1, 300)))
def test_next_end_takes_what_is_there_up_to_the_limit_and_never_goes_back(
    pos: tuple[dict[int, int], dict[int, int]], limit: int | None
) -> None:
    start, marks = pos
    end = next_end(start, marks, max_records=limit)
    top = {p: (marks[p] if marks[p] >= 0 else start[p]) for p in start}
    available = sum(top[p] - start[p] for p in start)
    assert set(end) == set(start)
    assert all(start[p] <= end[p] <= top[p] for p in start)
    taken = sum(end[p] - start[p] for p in start)
    assert taken == (available if limit is None else min(limit, available))
    if limit is not None:
        # fair: a partition left behind got at least an equal share of the limit
        have = [p for p in start if top[p] > start[p]]
        for p in have:
            if end[p] < top[p]:
                assert end[p] - start[p] >= limit // len(have) - 1


def test_next_end_caps_at_the_available_now_target_and_starts_new_partitions_at_zero() -> None:
    start = {0: 10, 1: 5}
    marks = {0: 50, 1: 40, 2: 7}  # partition 2 was added to the topic
    assert next_end(start, marks, target={0: 30, 1: 40, 2: 3}) == {0: 30, 1: 40, 2: 3}
    assert next_end(start, marks) == {0: 50, 1: 40, 2: 7}
    # a partition the answer missed stays where it is
    assert next_end({0: 10, 1: 5}, {0: 12}) == {0: 12, 1: 5}
    # a watermark below the start (a lagging new leader) never moves the end back
    assert next_end({0: 10}, {0: 4}) == {0: 10}


def test_plan_ranges_cuts_each_partition_and_skips_empty_ones() -> None:
    assert plan_ranges({0: 0, 1: 7, 2: 3}, {0: 5, 1: 7, 2: 4}, 2) == [
        StreamRange(0, 0, 2),
        StreamRange(0, 2, 4),
        StreamRange(0, 4, 5),
        StreamRange(2, 3, 4),
    ]
    assert plan_ranges({}, {0: 3}, 10) == [StreamRange(0, 0, 3)]
    with pytest.raises(PipelineError, match="before its start"):
        plan_ranges({0: 9}, {0: 3}, 10)


def test_offsets_round_trip_and_bad_ones_are_refused() -> None:
    assert parse_offsets(dump_offsets({2: 5, 0: 1})) == {0: 1, 2: 5}
    assert list(dump_offsets({2: 5, 0: 1})) == ["0", "2"]
    for bad in ({"x": 1}, {"0": -1}, {"0": "z"}):
        with pytest.raises(PipelineError, match="not a pidlease stream offset"):
            parse_offsets(bad)


def test_settings_parse_and_refuse() -> None:
    s = StreamReadSettings.parse({"topic": "t", "MAX_RECORDS_PER_TRIGGER": "9"})
    assert (s.topic, s.max_records_per_trigger, s.starting_offsets) == ("t", 9, "earliest")
    with pytest.raises(OptionError, match="starting_offsets"):
        StreamReadSettings.parse({"topic": "t", "starting_offsets": "middle"})
    with pytest.raises(OptionError, match="max_records_per_trigger"):
        StreamReadSettings.parse({"topic": "t", "max_records_per_trigger": "0"})
    with pytest.raises(OptionError, match="topic"):
        StreamReadSettings.parse({})
