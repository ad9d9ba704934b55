"""Compaction of the group log on real servers (issue 25; docs/kafka.md, "Compaction of
the group log"): a group's committed offsets rewritten many times, a deleted group and an
OffsetDelete (tombstones) in the same log partition; the coordinator writes checkpoints
and every replica of that partition deletes the segments below the newest one (the log
start moves on all three, their logs stay small); then the coordinator's server is
SIGKILLed and the server that replays what is left answers the last committed offset of
every partition, and neither the deleted group nor the deleted offset comes back."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from partition_server.kafka import codec as C
from partition_server.kafka.groups import GROUPS_TOPIC, partition_of
from tests.helpers import wait_for
from tests.integration.test_kafka_group_retention import coordinator
from tests.integration.test_kafka_groups import ENV
from tests.kafka_wire import KafkaWire

COMPACT_BYTES = 24_000
SEGMENT_BYTES = 8_192
COMMITS = 600
PARTS = 4


def commit(w: KafkaWire, group: str, offsets: dict[tuple[str, int], int]) -> dict[int, int]:
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (t, p), o in offsets.items():
        by_topic.setdefault(t, []).append(
            {
                "partition_index": p,
                "committed_offset": o,
                "committed_leader_epoch": -1,
                "committed_metadata": f"at {o}",
            }
        )
    for _ in range(100):
        r = w.request(
            C.OFFSET_COMMIT,
            8,
            {
                "group_id": group,
                "generation_id_or_member_epoch": -1,
                "member_id": "",
                "group_instance_id": None,
                "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()],
            },
        )
        codes = {p.partition_index: int(p.error_code) for t in r.topics for p in t.partitions}
        if set(codes.values()) != {14}:  # COORDINATOR_LOAD_IN_PROGRESS
            return codes
        time.sleep(0.2)
    raise AssertionError("the group's log partition never loaded")


def offset_fetch(w: KafkaWire, group: str) -> Any:
    r = w.request(
        C.OFFSET_FETCH,
        8,
        {"groups": [{"group_id": group, "topics": None}], "require_stable": False},
    )
    return r.groups[0]


def settled_coordinator(c: Any, group: str, not_at: str) -> str:
    """The new coordinator once it answers for the group: a FindCoordinator answer may
    name a server that has not taken the partition over yet (NOT_COORDINATOR, or the load
    in progress), which a client asks again, as this does."""

    def ready() -> str | None:
        a = coordinator(c, group, not_at=not_at)
        try:
            with KafkaWire(a) as w:
                code = int(offset_fetch(w, group).error_code)
        except (OSError, EOFError):
            return None
        return a if code == 0 else None

    return wait_for(ready, 90, f"a new coordinator answering for {group}")


def fetched(w: KafkaWire, group: str) -> dict[tuple[str, int], int]:
    def loaded() -> Any:
        g = offset_fetch(w, group)
        return g if int(g.error_code) != 14 else None

    g = wait_for(loaded, 60, f"{group}'s partition loaded")
    assert int(g.error_code) == 0, g
    return {(t.name, p.partition_index): p.committed_offset for t in g.topics for p in t.partitions}


def group_log_dirs(c: Any, idx: int) -> list[Path]:
    out = []
    for s in c.servers:
        d = c.data_dir / f"server-{s.ident}" / "data" / f"{GROUPS_TOPIC}-{idx}"
        if d.exists():
            out.append(d)
    return out


def first_base(d: Path) -> int:
    segs = sorted(d.glob("*.log"))
    return int(segs[0].stem) if segs else -1


def size(d: Path) -> int:
    return sum(f.stat().st_size for f in d.glob("*.log"))


def test_compacted_group_log_loses_nothing_across_a_coordinator_kill(make_cluster: Any) -> None:
    c = make_cluster(
        servers=3,
        env={
            **ENV,
            "PIDLEASE_GROUP_LOG_COMPACT_BYTES": str(COMPACT_BYTES),
            "PIDLEASE_GROUP_LOG_SEGMENT_BYTES": str(SEGMENT_BYTES),
            "PIDLEASE_SNAPSHOT_INTERVAL_MS": "500",
            "PIDLEASE_RETENTION_CHECK_MS": "300",
        },
    )
    c.create_topic("gtopic", partitions=PARTS, replication_factor=3)
    c.create_topic("other", partitions=2, replication_factor=3)
    kept = "compacted"
    idx = partition_of(kept)
    same = [f"g{i}" for i in range(2000) if partition_of(f"g{i}") == idx]
    deleted, trimmed = same[0], same[1]
    addr = coordinator(c, kept)
    last: dict[tuple[str, int], int] = {}
    with KafkaWire(addr) as w:
        # Tombstones early, so that they land in segments the compaction deletes.
        assert set(commit(w, deleted, {("gtopic", 0): 5}).values()) == {0}
        r = w.request(C.DELETE_GROUPS, 2, {"groups_names": [deleted]})
        assert int(r.results[0].error_code) == 0
        assert set(commit(w, trimmed, {("gtopic", 1): 7, ("other", 0): 8}).values()) == {0}
        r = w.request(
            C.OFFSET_DELETE,
            0,
            {
                "group_id": trimmed,
                "topics": [{"name": "other", "partitions": [{"partition_index": 0}]}],
            },
        )
        assert int(r.error_code) == 0
        for n in range(COMMITS):
            p = n % PARTS
            last[("gtopic", p)] = n
            assert commit(w, kept, {("gtopic", p): n}) == {p: 0}
        assert fetched(w, kept) == last

    # Every replica of the log partition cut its log at a checkpoint.
    dirs = group_log_dirs(c, idx)
    assert len(dirs) == 3
    wait_for(lambda: all(first_base(d) > 0 for d in dirs), 60, "every replica's log start moved")
    sizes = [size(d) for d in dirs]
    # Written: COMMITS batches of one offset (about 180 bytes each, 100 KB in all).
    assert max(sizes) < 3 * COMPACT_BYTES + 2 * SEGMENT_BYTES, sizes

    coord = next(s for s in c.servers if s.kafka_address == addr)
    c.kill(coord)
    addr2 = settled_coordinator(c, kept, not_at=addr)
    with KafkaWire(addr2) as w:
        assert fetched(w, kept) == last, "a committed offset lost with the compacted log"
        assert fetched(w, deleted) == {}, "a deleted group came back"
        assert fetched(w, trimmed) == {("gtopic", 1): 7}, "a deleted offset came back"
        r = w.request(C.LIST_GROUPS, 4, {"states_filter": []})
        names = {g.group_id for g in r.groups}
        assert kept in names and trimmed in names and deleted not in names
        # It goes on committing (and compacting) as the new coordinator.
        for n in range(COMMITS, COMMITS + 200):
            p = n % PARTS
            last[("gtopic", p)] = n
            assert commit(w, kept, {("gtopic", p): n}) == {p: 0}
        assert fetched(w, kept) == last
