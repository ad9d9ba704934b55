"""Offset retention of the group coordinator (issue 25: the group log's retention of stale
entries; Kafka's ``offsets.retention.minutes``, here ``group_offsets_retention_ms``) on
real servers: a group whose last member left loses its committed offsets and goes from
ListGroups once it has been empty that long, not before; a group still committing keeps
its offsets; the coordinator SIGKILLed afterwards, the server that replays the group log
brings back neither the expired group nor its offsets (the tombstones are durable). (The
retention here is shorter than a failover: "kept" is not checked after the kill, its
offsets may expire during it, as Kafka's would.)"""

from __future__ import annotations

import threading
import time
from typing import Any

from partition_server.kafka import codec as C
from tests.helpers import wait_for
from tests.integration.test_kafka_groups import ENV, _commit, _fetch, _join
from tests.kafka_wire import KafkaWire

RETENTION_MS = 4_000


def offsets(w: KafkaWire, group: str) -> list[tuple[str, int, int]]:
    def loaded() -> Any:
        g = _fetch(w, group)
        return g if int(g.error_code) != 14 else None  # COORDINATOR_LOAD_IN_PROGRESS

    g = wait_for(loaded, 30, f"{group}'s partition loaded")
    assert int(g.error_code) == 0, g
    return [(t.name, p.partition_index, p.committed_offset) for t in g.topics for p in t.partitions]


def coordinator(c: Any, group: str, not_at: str = "") -> str:
    """The group's coordinator, asked of any server that answers (one may be dead)."""

    def find() -> str | None:
        for s in c.servers:
            try:
                with KafkaWire(s.kafka_address) as w:
                    r = w.request(C.FIND_COORDINATOR, 3, {"key": group, "key_type": 0})
            except OSError:
                continue
            if int(r.error_code) == 0 and f"{r.host}:{r.port}" != not_at:
                return f"{r.host}:{r.port}"
        return None

    return wait_for(find, 60, f"a coordinator for {group}")


def listed(w: KafkaWire) -> set[str]:
    r = w.request(C.LIST_GROUPS, 4, {"states_filter": []})
    return {g.group_id for g in r.groups}


def test_an_empty_groups_offsets_expire_and_stay_expired_after_a_failover(
    make_cluster: Any,
) -> None:
    c = make_cluster(
        servers=2, env={**ENV, "PIDLEASE_GROUP_OFFSETS_RETENTION_MS": str(RETENTION_MS)}
    )
    c.create_topic("gtopic", partitions=1, replication_factor=2)
    fading, kept = "fading", "kept"
    addr = coordinator(c, fading)
    stop = threading.Event()

    def keep_committing() -> None:
        n = 0
        while not stop.is_set():
            try:
                with KafkaWire(coordinator(c, kept)) as w:
                    while not stop.is_set():
                        n += 1
                        _commit(w, kept, "", -1, n)
                        stop.wait(0.5)
            except (OSError, EOFError):
                stop.wait(0.5)  # its coordinator killed: find the next one

    committer = threading.Thread(target=keep_committing, daemon=True)
    committer.start()
    try:
        with KafkaWire(addr) as w:
            a = _join(w, fading)
            assert int(a.error_code) == 0
            sync = w.request(
                C.SYNC_GROUP,
                3,
                {
                    "group_id": fading,
                    "generation_id": a.generation_id,
                    "member_id": a.member_id,
                    "assignments": [{"member_id": a.member_id, "assignment": b""}],
                },
            )
            assert int(sync.error_code) == 0
            assert _commit(w, fading, a.member_id, a.generation_id, 7) == 0
            r = w.request(
                C.LEAVE_GROUP, 4, {"group_id": fading, "members": [{"member_id": a.member_id}]}
            )
            assert int(r.error_code) == 0
            left = time.monotonic()
            assert offsets(w, fading) == [("gtopic", 0, 7)]
            assert fading in listed(w)
            wait_for(lambda: not offsets(w, fading), 30, "the empty group's offsets expired")
            took = time.monotonic() - left
            assert took >= RETENTION_MS / 1000 - 0.5, f"expired {took:.1f} s after it emptied"
            wait_for(lambda: fading not in listed(w), 10, "the expired group gone")
        with KafkaWire(coordinator(c, kept)) as w:
            assert offsets(w, kept), "a group still committing keeps its offsets"
        stop.set()
        committer.join(10)
        # The coordinator of the expired group SIGKILLed: the replay keeps it gone.
        c.kill(next(s for s in c.servers if s.kafka_address == addr))
        addr2 = coordinator(c, fading, not_at=addr)
        with KafkaWire(addr2) as w:
            assert offsets(w, fading) == []
            wait_for(lambda: int(w.request(C.LIST_GROUPS, 4, {}).error_code) == 0, 30, "loaded")
            assert fading not in listed(w)
    finally:
        stop.set()
        committer.join(10)
