"""Consumer groups with real Kafka clients on real partition servers (issue 25, item 1):

- confluent-kafka: 3 members (own processes) of one group on a 6-partition R=3 topic while
  an idempotent producer writes; one member SIGKILLed (its partitions taken over after its
  session timeout), then the server coordinating the group SIGKILLed (the group's log
  partition moves, the new leader replays it), then every member stopped and 3 new ones
  started. Checked from the members' own logs: every record read, none skipped; a member
  starting on a partition starts at or after every commit made before it started (no
  re-read of anything committed) and the restarted group starts each partition exactly at
  its last commit.
- aiokafka (two members, one leaves; a restart resumes from the commits) and kcat ``-G``
  in smaller form; raw requests for the generation checks (a zombie member's commit is
  refused), DeleteGroups/OffsetDelete and NOT_COORDINATOR.

``PIDLEASE_GROUPS_LONG=1`` makes the confluent-kafka run ten times longer.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import time
from typing import Any

from partition_server.kafka import codec as C
from partition_server.kafka.groups import GROUPS_TOPIC, partition_of
from pidlease.testing.devcluster import LocalCluster
from tests.helpers import wait_for
from tests.integration.kafka_group_clients import (
    ENV,
    Sender,
    check_group_log,
    first_reads,
    kcat_consume,
    kcat_produce,
    leader_of,
    start_member,
    stop_members,
    wait_read,
)
from tests.kafka_wire import KafkaWire

LONG = os.environ.get("PIDLEASE_GROUPS_LONG") == "1"


# -- confluent-kafka: the run ---------------------------------------------------------
def test_confluent_group_member_and_coordinator_killed_then_all_restarted(  # type: ignore[no-untyped-def]
    make_cluster, tmp_path
) -> None:
    # The members and the sender are confluent_kafka clients (kafka_group_clients.py, which
    # imports it); named here too, for the client matrix's check that each test it lists
    # uses its client (tests/unit/repo/test_kafka_matrix_doc.py reads this file).
    import confluent_kafka  # noqa: F401 - named for that check; the helpers use it

    c = make_cluster(servers=3, env=ENV)
    topic, group = "gorders", "billing"
    c.create_topic(topic, partitions=6, replication_factor=3)
    rate = 150.0
    phase_s = 40.0 if LONG else 4.0
    sender = Sender(c.kafka_bootstrap, topic, 6, rate)
    members = [start_member(c, group, topic, tmp_path / f"m{i}.log") for i in range(3)]
    all_members = list(members)
    try:
        sender.start()
        # All three share the partitions.
        wait_for(
            lambda: all(any(k == "R" for k, _, _ in m.read()) for m in members),
            90,
            "every member reading",
        )
        time.sleep(phase_s)
        # 1. A member SIGKILLed: its partitions are taken over after its session timeout.
        members[0].proc.kill()
        members[0].proc.wait(10)
        time.sleep(phase_s)
        wait_read(all_members, list(sender.acked), 90)
        # 2. The server coordinating the group SIGKILLed.
        coord = leader_of(c, GROUPS_TOPIC, partition_of(group))
        c.kill(c.server(coord))
        time.sleep(phase_s)
        wait_read(all_members, list(sender.acked), 120)
        c.start_service(c.server(coord))
        # 3. Every member stopped; the producer stops too; three new members resume.
        sender.stop()
        wait_read(all_members, sender.acked, 120)
        stop_members(members)
        last = check_group_log(all_members, sender.acked)
        assert len(last) == 6, f"every partition committed: {last}"
        fresh = [start_member(c, group, topic, tmp_path / f"n{i}.log") for i in range(3)]
        all_members += fresh
        more = Sender(c.kafka_bootstrap, topic, 6, rate)
        more.start()
        time.sleep(2)
        more.stop()
        wait_read(all_members, sender.acked + more.acked, 120)
        starts = first_reads(fresh)
        assert starts == last, "the restarted group starts each partition at its last commit"
        check_group_log(all_members, sender.acked + more.acked)
    finally:
        sender.halt()
        stop_members(all_members)


# -- aiokafka -----------------------------------------------------------------------------------
def test_aiokafka_group_rebalance_and_resume(make_cluster) -> None:  # type: ignore[no-untyped-def]
    from aiokafka import AIOKafkaConsumer

    c = make_cluster(servers=2, env=ENV)
    topic, group = "aevents", "aio"
    c.create_topic(topic, partitions=4, replication_factor=2)
    sender = Sender(c.kafka_bootstrap, topic, 4, 1000.0)
    sender.start()
    time.sleep(0.4)
    sender.stop()
    acked = set(sender.acked)

    def consumer() -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            topic,
            bootstrap_servers=c.kafka_bootstrap,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
        )

    async def drain(
        cons: AIOKafkaConsumer, got: set[tuple[int, int, str]], want: int, wait_s: float = 60
    ) -> None:
        deadline = time.monotonic() + wait_s
        while len(got) < want and time.monotonic() < deadline:
            batch = await cons.getmany(timeout_ms=500)
            for tp, msgs in batch.items():
                for m in msgs:
                    got.add((tp.partition, m.offset, m.value.decode()))
            if batch:
                await cons.commit()

    async def main() -> None:
        a, b = consumer(), consumer()
        await a.start()
        await b.start()
        got: set[tuple[int, int, str]] = set()
        try:
            await asyncio.wait_for(
                asyncio.gather(drain(a, got, len(acked)), drain(b, got, len(acked))), 90
            )
            parts = [len(x.assignment()) for x in (a, b)]
        finally:
            await b.stop()  # leaves the group: a gets every partition
            await a.stop()
        assert got == acked
        assert sorted(parts) == [2, 2], parts
        # Restarted: nothing to read but what comes next.
        more = Sender(c.kafka_bootstrap, topic, 4, 1000.0)
        more.start()
        await asyncio.sleep(0.3)
        more.stop()
        d = consumer()
        await d.start()
        later: set[tuple[int, int, str]] = set()
        try:
            await drain(d, later, len(more.acked))
            await drain(d, later, len(more.acked) + 1, 2)  # anything older would show up
        finally:
            await d.stop()
        assert later == set(more.acked), "resumed at the commits: no older record re-read"

    asyncio.run(main())


# -- kcat -G ------------------------------------------------------------------------------------
def test_kcat_balanced_consumer_commits(make_cluster) -> None:  # type: ignore[no-untyped-def]
    c = make_cluster(servers=1)
    c.create_topic("klines", partitions=2)

    first = [f"a{i:03d}" for i in range(100)]
    kcat_produce(c.kafka_bootstrap, "klines", first)
    assert kcat_consume(c.kafka_bootstrap, "kgroup", "klines") == sorted(first)
    second = [f"b{i:03d}" for i in range(50)]
    kcat_produce(c.kafka_bootstrap, "klines", second)
    assert kcat_consume(c.kafka_bootstrap, "kgroup", "klines") == sorted(second), (
        "the second run resumes at the first run's commits"
    )


# -- raw requests: generation checks, deletes, NOT_COORDINATOR ------------------------------------
def _coordinator(c: LocalCluster, group: str) -> str:
    def find() -> str | None:
        with KafkaWire(c.servers[0].kafka_address) as w:
            r = w.request(C.FIND_COORDINATOR, 3, {"key": group, "key_type": 0})
        if int(r.error_code) != 0:
            return None
        return f"{r.host}:{r.port}"

    return wait_for(find, 60, f"a coordinator for {group}")


def _join(w: KafkaWire, group: str, member: str = "") -> Any:
    meta = b"\0\0\0\0\0\1\0\6gtopic\xff\xff\xff\xff"  # consumer protocol v0: ["gtopic"]
    for _ in range(100):
        r = w.request(
            C.JOIN_GROUP,
            5,
            {
                "group_id": group,
                "session_timeout": dt.timedelta(seconds=6),
                "rebalance_timeout": dt.timedelta(seconds=6),
                "member_id": member,
                "group_instance_id": None,
                "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": meta}],
            },
        )
        code = int(r.error_code)
        if code == 79:  # MEMBER_ID_REQUIRED: join again with the id given
            member = r.member_id
            continue
        if code == 14:  # COORDINATOR_LOAD_IN_PROGRESS
            time.sleep(0.1)
            continue
        return r
    raise AssertionError("JoinGroup never answered")


def _commit(w: KafkaWire, group: str, member: str, generation: int, offset: int) -> int:
    r = w.request(
        C.OFFSET_COMMIT,
        8,
        {
            "group_id": group,
            "generation_id_or_member_epoch": generation,
            "member_id": member,
            "group_instance_id": None,
            "topics": [
                {
                    "name": "gtopic",
                    "partitions": [
                        {
                            "partition_index": 0,
                            "committed_offset": offset,
                            "committed_leader_epoch": -1,
                            "committed_metadata": "",
                        }
                    ],
                }
            ],
        },
    )
    return int(r.topics[0].partitions[0].error_code)


def _fetch(w: KafkaWire, group: str) -> Any:
    r = w.request(
        C.OFFSET_FETCH,
        8,
        {"groups": [{"group_id": group, "topics": None}], "require_stable": False},
    )
    return r.groups[0]


def test_zombie_commit_refused_and_deletes_are_durable(make_cluster) -> None:  # type: ignore[no-untyped-def]
    c = make_cluster(servers=2, env=ENV)
    c.create_topic("gtopic", partitions=1, replication_factor=2)
    group = "zombies"
    addr = _coordinator(c, group)
    other = next(s.kafka_address for s in c.servers if s.kafka_address != addr)
    with KafkaWire(other) as w:
        r = w.request(C.HEARTBEAT, 3, {"group_id": group, "generation_id": 1, "member_id": "x"})
        assert int(r.error_code) == 16, "a server that does not lead the group: NOT_COORDINATOR"
    with KafkaWire(addr) as w:
        a = _join(w, group)
        assert int(a.error_code) == 0 and a.leader == a.member_id
        sync = w.request(
            C.SYNC_GROUP,
            3,
            {
                "group_id": group,
                "generation_id": a.generation_id,
                "member_id": a.member_id,
                "assignments": [{"member_id": a.member_id, "assignment": b"x"}],
            },
        )
        assert int(sync.error_code) == 0 and sync.assignment == b"x"
        assert _commit(w, group, a.member_id, a.generation_id, 5) == 0
        # A second member joins: a rebalance to generation + 1, which a ignores (a zombie).
        with KafkaWire(addr) as w2:
            w2.send_raw(
                w2.frame(
                    C.JOIN_GROUP,
                    0,
                    {
                        "group_id": group,
                        "session_timeout": dt.timedelta(seconds=6),
                        "member_id": "",
                        "protocol_type": "consumer",
                        "protocols": [{"name": "range", "metadata": b""}],
                    },
                )
            )
            # a's session (6 s) runs out: b's join completes without a.
            b = w2.read_response(C.JOIN_GROUP, 0)
            assert int(b.error_code) == 0 and b.generation_id == a.generation_id + 1
            assert _commit(w, group, a.member_id, a.generation_id, 9) == 25  # UNKNOWN_MEMBER_ID
            assert _commit(w, group, b.member_id, a.generation_id, 9) == 22  # ILLEGAL_GENERATION
            assert _commit(w, group, "", -1, 9) == 25, "a simple commit into a live group"
            got = _fetch(w, group)
            assert [(p.partition_index, p.committed_offset) for p in got.topics[0].partitions] == [
                (0, 5)
            ]
            r = w.request(C.DELETE_GROUPS, 2, {"groups_names": [group]})
            assert int(r.results[0].error_code) == 68  # NON_EMPTY_GROUP
            w2.request(
                C.LEAVE_GROUP,
                4,
                {"group_id": group, "members": [{"member_id": b.member_id}]},
            )
        r = w.request(
            C.OFFSET_DELETE,
            0,
            {
                "group_id": group,
                "topics": [{"name": "gtopic", "partitions": [{"partition_index": 0}]}],
            },
        )
        assert int(r.error_code) == 0
        assert not _fetch(w, group).topics
        assert _commit(w, group, "", -1, 11) == 0
        r = w.request(
            C.DESCRIBE_GROUPS, 5, {"groups": [group], "include_authorized_operations": False}
        )
        assert r.groups[0].group_state == "Empty"
        r = w.request(C.DELETE_GROUPS, 2, {"groups_names": [group]})
        assert int(r.results[0].error_code) == 0
        r = w.request(C.DELETE_GROUPS, 2, {"groups_names": [group]})
        assert int(r.results[0].error_code) == 69  # GROUP_ID_NOT_FOUND
        # Recreated by a simple commit; and another group of the same log partition
        # committed, then deleted.
        assert _commit(w, group, "", -1, 13) == 0
        gone = next(
            f"gone{i}" for i in range(1000) if partition_of(f"gone{i}") == partition_of(group)
        )
        assert _commit(w, gone, "", -1, 3) == 0
        r = w.request(C.DELETE_GROUPS, 2, {"groups_names": [gone]})
        assert int(r.results[0].error_code) == 0
    # The coordinator SIGKILLed: the other server replays the log: the delete holds.
    coord = next(s for s in c.servers if s.kafka_address == addr)
    c.kill(coord)
    addr2 = wait_for(
        lambda: (a := _coordinator(c, group)) != addr and a, 60, "the group's new coordinator"
    )
    with KafkaWire(addr2) as w:

        def loaded() -> Any:
            r = w.request(C.LIST_GROUPS, 4, {"states_filter": []})
            return r if int(r.error_code) == 0 else None

        wait_for(loaded, 30, "the group log loaded")

        def fetched() -> Any:
            g = _fetch(w, group)
            return g if int(g.error_code) != 14 else None

        got = wait_for(fetched, 30, "the group's partition loaded")
        assert [(p.partition_index, p.committed_offset) for p in got.topics[0].partitions] == [
            (0, 13)
        ], "the log replayed: the last commit, after the deletes"
        assert not _fetch(w, gone).topics, "a deleted group's offsets stay deleted"
        listed = {g.group_id for g in w.request(C.LIST_GROUPS, 4, {"states_filter": []}).groups}
        assert group in listed and gone not in listed


# -- fuzzed group requests: no crash, no corrupted state ------------------------------------------
def _group_frames(w: KafkaWire) -> list[bytes]:
    """Well-formed group requests, odd on purpose, at several versions."""
    s6 = dt.timedelta(seconds=6)
    commit = {
        "group_id": "fuzz",
        "generation_id_or_member_epoch": -1,
        "member_id": "",
        "group_instance_id": None,
        "topics": [
            {
                "name": "gtopic",
                "partitions": [
                    {"partition_index": i, "committed_offset": o, "committed_metadata": m}
                    for i, o, m in [(0, -5, ""), (7, 1, ""), (0, 2**62, "m" * 5000)]
                ],
            },
            {"name": "nope", "partitions": [{"partition_index": 0, "committed_offset": 1}]},
        ],
    }
    join = {
        "group_id": "fuzz",
        "session_timeout": s6,
        "rebalance_timeout": s6,
        "member_id": "",
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b"\xff" * 7}],
    }
    reqs: list[tuple[int, int, dict[str, Any]]] = [
        (C.FIND_COORDINATOR, 0, {"key": ""}),
        (C.FIND_COORDINATOR, 3, {"key": "fuzz", "key_type": 1}),
        (C.FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": ["a", "", "x" * 300]}),
        (C.JOIN_GROUP, 0, {**join, "group_id": ""}),
        (C.JOIN_GROUP, 5, {**join, "session_timeout": dt.timedelta(0)}),
        (C.JOIN_GROUP, 5, {**join, "protocols": []}),
        (C.JOIN_GROUP, 7, {**join, "member_id": "made-up"}),
        (C.JOIN_GROUP, 2, {**join, "group_id": "g" * 400}),
        (C.SYNC_GROUP, 5, {"group_id": "fuzz", "generation_id": 9, "member_id": "x"}),
        (C.SYNC_GROUP, 0, {"group_id": "", "generation_id": -1, "member_id": ""}),
        (C.HEARTBEAT, 4, {"group_id": "fuzz", "generation_id": -1, "member_id": ""}),
        (C.LEAVE_GROUP, 4, {"group_id": "fuzz", "members": [{"member_id": "a"}] * 3}),
        (C.LEAVE_GROUP, 0, {"group_id": "", "member_id": ""}),
        (C.OFFSET_COMMIT, 2, commit),
        (C.OFFSET_COMMIT, 8, {**commit, "generation_id_or_member_epoch": 3, "member_id": "m"}),
        (C.OFFSET_FETCH, 1, {"group_id": "fuzz", "topics": []}),
        (C.OFFSET_FETCH, 7, {"group_id": "", "topics": None, "require_stable": True}),
        (C.OFFSET_FETCH, 8, {"groups": [{"group_id": "a", "topics": None}] * 3}),
        (C.LIST_GROUPS, 4, {"states_filter": ["nonsense", "Empty"]}),
        (C.DESCRIBE_GROUPS, 5, {"groups": ["", "fuzz", "none"]}),
        (C.DELETE_GROUPS, 2, {"groups_names": ["", "keep-not", "fuzz"]}),
        (C.OFFSET_DELETE, 0, {"group_id": "", "topics": [{"name": "gtopic", "partitions": []}]}),
    ]
    return [w.frame(k, v, values) for k, v, values in reqs]


def test_fuzzed_group_requests(make_cluster) -> None:  # type: ignore[no-untyped-def]
    import random

    c = make_cluster(servers=1)
    c.create_topic("gtopic", partitions=1)
    addr = _coordinator(c, "keep")
    with KafkaWire(addr) as w:
        wait_for(lambda: _commit(w, "keep", "", -1, 42) == 0, 30, "a first commit")
        frames = _group_frames(w)
    rnd = random.Random(25)
    answered = closed = 0
    for i in range(400):
        frame = bytearray(rnd.choice(frames))
        if i >= len(frames):  # after one clean pass: mutations
            for _ in range(rnd.randint(1, 4)):
                frame[rnd.randrange(8, len(frame))] = rnd.randrange(256)
            if rnd.random() < 0.3:
                frame = frame[: rnd.randrange(10, len(frame))]
            struct_len = len(frame) - 4
            frame[:4] = struct_len.to_bytes(4, "big")
        with KafkaWire(addr, timeout_s=10) as f:
            f.send_raw(bytes(frame))
            f.sock.settimeout(10)
            try:
                f.read_frame()
                answered += 1
            except (EOFError, ConnectionError):
                closed += 1
    assert answered > len(frames)
    with KafkaWire(addr) as w:
        assert int(w.request(C.API_VERSIONS, 3, {}).error_code) == 0
        got = _fetch(w, "keep")
        assert [(p.partition_index, p.committed_offset) for p in got.topics[0].partitions] == [
            (0, 42)
        ], "another group's offsets untouched"
    log = (c.servers[0].log_path).read_text()
    assert "Kafka connection failed" not in log and "failed\nTraceback" not in log
    assert "Traceback" not in log, log[log.find("Traceback") - 300 :][:3000]
