"""The exactly-once audit's counting, on hand-made logs."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pidlease import errors
from pidlease.cli.verify import Runs, audit, load_acked
from pidlease.wire.protocol import Record

# tests/unit/conftest.py: each test of this module runs on the fast and the readable path
SDK_BOTH_PATHS = True


def recs(*pid_seqs: tuple[int, int]) -> list[Record]:
    return [
        Record("t", 0, off, pid, 1, seq, None, b"", 0) for off, (pid, seq) in enumerate(pid_seqs)
    ]


def run(log: list[Record], dedup: str = "strict", acked=None):  # type: ignore[no-untyped-def]
    return audit("t", 1, dedup, lambda p: iter(log), acked)


def test_clean_log_is_ok() -> None:
    r = run(recs((5, 0), (6, 0), (5, 1), (6, 1), (5, 2)), acked=[(0, 5, 2), (0, 6, 0)])
    assert r.ok
    text = r.summary()
    assert "EXACTLY-ONCE: OK" in text and "acked 2, present 2, missing 0" in text
    assert r.partitions[0].pids == 2


def test_duplicate_out_of_order_gap_and_missing_are_found() -> None:
    r = run(recs((5, 0), (5, 1), (5, 1), (5, 3), (5, 2), (7, 4), (7, 6)), acked=[(0, 5, 9)])
    pa = r.partitions[0]
    assert (pa.duplicates, pa.out_of_order, pa.gaps, pa.acked_missing) == (1, 1, 1, 1)
    assert not r.ok
    text = r.summary()
    assert "EXACTLY-ONCE: VIOLATED" in text
    assert "pid 5 sequence 1 appears again at offset 2" in text
    assert "acked pid 5 sequence 9 is not in the log" in text


def test_monotonic_topics_allow_holes_but_not_duplicates() -> None:
    assert run(recs((5, 0), (5, 10), (5, 11)), dedup="monotonic").ok
    assert not run(recs((5, 0), (5, 10), (5, 10)), dedup="monotonic").ok


def test_pid_zero_and_control_records_are_not_checked() -> None:
    log = recs((0, 3), (0, 3), (5, 0))
    log.append(Record("t", 0, 3, 5, 2, -1, b"fence", b"", 0, is_control=True))
    r = run(log)
    assert r.ok and r.partitions[0].records == 3 and r.partitions[0].unchecked_records == 2


def test_acked_for_a_partition_that_does_not_exist_is_an_error() -> None:
    with pytest.raises(errors.ConfigError):
        run(recs((5, 0)), acked=[(3, 5, 0)])


def test_load_acked(tmp_path) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "acked.jsonl"
    f.write_text(json.dumps({"partition": 1, "sequence_id": 4, "pid": 9}) + "\n\n")
    assert load_acked(f) == [(1, 9, 4)]
    f.write_text('{"partition": 1}\n')
    with pytest.raises(errors.ConfigError, match="line 1"):
        load_acked(f)


@given(st.lists(st.integers(0, 60), max_size=200))
def test_runs_match_a_set(xs: list[int]) -> None:
    runs, seen = Runs(), set()
    for x in xs:
        assert runs.add(x) == (x not in seen)
        seen.add(x)
    assert runs.count == len(seen)
    assert all((x in runs) == (x in seen) for x in range(-1, 62))
    assert runs.missing() == (max(seen) - min(seen) + 1 - len(seen) if seen else 0)
    assert all(s <= e for s, e in zip(runs.starts, runs.ends, strict=True))  # one end a start
    # each run ends more than one below the next one's start (the last run has no next)
    assert all(e + 1 < s for e, s in zip(runs.ends, runs.starts[1:], strict=False))


def test_shuffled_log_counts_out_of_order_not_duplicates() -> None:
    seqs = list(range(100))
    random.Random(3).shuffle(seqs)
    r = run(recs(*[(5, s) for s in seqs]))
    assert (
        r.partitions[0].duplicates == 0
        and r.partitions[0].out_of_order > 0
        and r.partitions[0].gaps == 0
    )
