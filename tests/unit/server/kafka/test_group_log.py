"""Compaction of the group log (``group_log.py``), against a reference model written from
docs/kafka.md ("Consumer groups", "Compaction of the group log"), not from the module:

- an offset record sets that offset, its tombstone removes it; a group record sets the
  group's generation and empty time to the largest seen and its protocol type to the last;
  a group tombstone removes the group and every offset of it; an offset of an unknown
  group makes the group (generation 0, no protocol type, empty time 0);
- a checkpoint (the table's image, then a marker naming where the image starts) may be
  written after any record, any number of times, and then any prefix of the log up to the
  newest checkpoint's start may go (a segment boundary is anywhere): the replay of what is
  left gives the groups the replay of the whole log gives, tombstones included;
- a replica reading the log left (a follower after a start-over, a new leader) learns the
  same checkpoint start, and its own table's image replays to the same groups.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from partition_server.kafka import group_state as G
from partition_server.kafka.group_log import (
    CHECKPOINT_KEY,
    LogTable,
    checkpoint_batches,
    checkpoint_size,
    group_key,
    offset_key,
    offset_value,
    replay,
)

Rec = tuple[bytes | None, bytes | None]
GIDS = ["a", "b", "c"]
TOPICS = ["t", "u"]


def model(records: list[Rec]) -> dict[str, Any]:
    """The contract's replay, by hand."""
    out: dict[str, Any] = {}
    for k, v in records:
        try:
            key = json.loads(k or b"null")
            val = json.loads(v) if v else None
        except ValueError:
            continue
        if not isinstance(key, list) or not key:
            continue
        if key[0] == "o" and len(key) == 4:
            gid, topic, p = key[1], key[2], key[3]
            if val is None:
                if gid in out:
                    out[gid]["offsets"].pop((topic, p), None)
                continue
            g = out.setdefault(gid, {"gen": 0, "pt": None, "ts": 0, "offsets": {}})
            g["offsets"][(topic, p)] = (val["o"], val["e"], val["m"], val["ts"])
        elif key[0] == "g":
            gid = key[1]
            if val is None:
                out.pop(gid, None)
                continue
            g = out.setdefault(gid, {"gen": 0, "pt": None, "ts": 0, "offsets": {}})
            g["gen"] = max(g["gen"], val["gen"])
            g["pt"] = val["pt"]
            g["ts"] = max(g["ts"], val.get("ts", 0))
    return out


def state(records: list[Rec]) -> dict[str, Any]:
    """The module's replay, in the model's shape."""
    return {
        gid: {
            "gen": g.generation,
            "pt": g.protocol_type,
            "ts": g.empty_since_ms,
            "offsets": {
                tp: (e.offset, e.leader_epoch, e.metadata, e.commit_ms)
                for tp, e in g.offsets.items()
            },
        }
        for gid, g in replay(records).items()
    }


def table_of(records: list[Rec]) -> LogTable:
    t = LogTable()
    for k, v in records:
        t.apply(k, v)
    return t


commit = st.builds(
    lambda gid, topic, p, off, ts: (
        offset_key(gid, topic, p),
        offset_value(G.OffsetEntry(off, -1, f"m{off}", ts)),
    ),
    st.sampled_from(GIDS),
    st.sampled_from(TOPICS),
    st.integers(0, 2),
    st.integers(0, 1000),
    st.integers(0, 10_000),
)
offset_tombstone = st.builds(
    lambda gid, topic, p: (offset_key(gid, topic, p), None),
    st.sampled_from(GIDS),
    st.sampled_from(TOPICS),
    st.integers(0, 2),
)
group_rec = st.builds(
    lambda gid, gen, pt, ts: (
        group_key(gid),
        json.dumps({"gen": gen, "pt": pt, "pn": None, "members": 0, "ts": ts}).encode(),
    ),
    st.sampled_from(GIDS),
    st.integers(0, 20),
    st.sampled_from([None, "consumer", "connect"]),
    st.integers(0, 10_000),  # not monotonic: clocks differ between coordinators
)
group_tombstone = st.builds(lambda gid: (group_key(gid), None), st.sampled_from(GIDS))
junk = st.sampled_from([(b"not json", b"{}"), (b'["o", "a"]', b"{}"), (None, b"x"), (b"[]", None)])
record = st.one_of(commit, commit, offset_tombstone, group_rec, group_tombstone, junk)
# A step: a record, or ("checkpoint", cut fraction).
step = st.one_of(record, st.tuples(st.just("checkpoint"), st.floats(0, 1)))


def run(steps: list[Any]) -> tuple[list[Rec], list[Rec], int]:
    """(the whole log, the log left after each checkpoint's cut, the newest start)."""
    whole: list[Rec] = []
    left: list[Rec] = []  # the same log with a prefix cut away
    cut = 0  # offset of left[0] in whole
    newest = -1
    for s in steps:
        if s[0] == "checkpoint":
            start = len(whole)
            image = table_of(left).image()  # what this replica's table holds now
            batches = checkpoint_batches(image, start, 200)
            written = [r for b in batches for r in b]
            assert written[-1][0] == CHECKPOINT_KEY
            assert checkpoint_size(written[-1][1]) == sum(len(k) + len(v) for k, v in image)
            whole += written
            left += written
            newest = start
            # Any prefix up to the checkpoint's start may go.
            drop = cut + int(s[1] * (start - cut))
            left = left[drop - cut :]
            cut = drop
        else:
            whole.append(s)
            left.append(s)
    return whole, left, newest


@settings(max_examples=400, deadline=None)
@given(st.lists(step, max_size=60))
def test_the_compacted_log_replays_to_the_whole_logs_groups(steps: list[Any]) -> None:
    whole, left, newest = run(steps)
    assert state(whole) == model(whole)
    assert state(left) == model(whole)
    t = table_of(left)  # a replica reading only what is left
    assert t.checkpoint_from == newest
    assert state(t.image()) == model(whole)


def test_a_group_tombstone_takes_its_offsets_and_stays_after_the_cut() -> None:
    e = G.OffsetEntry(5, -1, "", 1)
    log: list[Rec] = [
        (offset_key("a", "t", 0), offset_value(e)),
        (offset_key("b", "t", 0), offset_value(e)),
        (group_key("a"), None),
        (offset_key("b", "t", 0), None),
    ]
    image = table_of(log).image()
    # b stays (known by an offset once), without offsets; a is gone.
    assert state(image) == {"b": {"gen": 0, "pt": None, "ts": 0, "offsets": {}}}
    # Cut anywhere up to the checkpoint: same.
    for i in range(len(log) + 1):
        assert state(log[i:] + image) == state(log), i


def test_checkpoint_batches_respect_the_size_and_end_with_the_marker() -> None:
    e = G.OffsetEntry(5, -1, "x" * 50, 1)
    image = [(offset_key("g", "t", p), offset_value(e)) for p in range(100)]
    batches = checkpoint_batches(image, 1234, 1000)
    assert len(batches) > 5
    for b in batches:
        assert sum(len(k) + len(v or b"") + 16 for k, v in b[:-1]) <= 1000
    assert [r for b in batches for r in b][:-1] == image
    assert batches[-1][-1] == (
        CHECKPOINT_KEY,
        json.dumps({"from": 1234, "bytes": sum(len(k) + len(v) for k, v in image)}).encode(),
    )


def test_retention_releases_whole_segments_below_the_checkpoint_only() -> None:
    from partition_server.retention import LogPolicy, SegmentInfo, segments_to_delete

    segs = [
        SegmentInfo(0, 100, 10, 0),
        SegmentInfo(100, 200, 10, 0),
        SegmentInfo(200, 300, 10, 0),
        SegmentInfo(300, 350, 10, 0),  # the active one
    ]
    keep = LogPolicy()  # no retention by time or size: the group log's
    at = {"high_watermark": 350, "replay_from": 350}
    assert segments_to_delete(segs, keep, 10**12, **at) == (0, 0)
    # A checkpoint starting at 250: the two segments wholly below go, not the one holding it.
    assert segments_to_delete(segs, keep, 10**12, **at, release_below=250) == (2, 0)
    assert segments_to_delete(segs, keep, 10**12, **at, release_below=200) == (2, 0)
    # Never above the high watermark, nor past the newest snapshot's replay start.
    assert segments_to_delete(
        segs, keep, 0, high_watermark=150, replay_from=350, release_below=250
    ) == (1, 0)
    assert segments_to_delete(
        segs, keep, 0, high_watermark=350, replay_from=150, release_below=250
    ) == (1, 1)
    # Never the active segment.
    assert segments_to_delete(segs, keep, 0, **at, release_below=10**9) == (3, 0)
