"""The issue's "the same in smaller form" for aiokafka and kcat ``-G`` (issue 25, Must
show): what test_kafka_groups.py's confluent-kafka run shows, with fewer members and
partitions.

- aiokafka: 2 members (own processes: kafka_group_consumer.py, driven and checked by
  kafka_group_clients.py, as there) of one group on a 4-partition R=3 topic while an
  idempotent producer writes; one member SIGKILLed (the other takes its partitions over
  after its session timeout), then the server coordinating the group SIGKILLed, then the
  member stopped and 2 new ones started: every record read, none skipped, no committed
  record read again by a member starting a partition, and the new members start each
  partition exactly at its last commit.
- kcat ``-G``: a run reads everything and commits; the server coordinating the group is
  SIGKILLed; the next run (against the new coordinator) reads only what came after.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from partition_server.kafka.groups import GROUPS_TOPIC, partition_of
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


def test_aiokafka_member_and_coordinator_killed_then_restarted(
    make_cluster: Any, tmp_path: Path
) -> None:
    c = make_cluster(servers=3, env=ENV)
    topic, group = "aorders", "aiobilling"
    c.create_topic(topic, partitions=4, replication_factor=3)
    sender = Sender(c.kafka_bootstrap, topic, 4, 100.0)
    members = [start_member(c, group, topic, tmp_path / f"m{i}.log", "aiokafka") for i in range(2)]
    all_members = list(members)
    try:
        sender.start()
        wait_read(all_members, list(sender.acked)[:8] or [], 90)
        time.sleep(3)
        members[0].proc.kill()  # SIGKILL: its partitions go to the other after 6 s
        members[0].proc.wait(10)
        time.sleep(3)
        wait_read(all_members, list(sender.acked), 90)
        coord = leader_of(c, GROUPS_TOPIC, partition_of(group))
        c.kill(c.server(coord))
        time.sleep(3)
        wait_read(all_members, list(sender.acked), 120)
        c.start_service(c.server(coord))
        sender.stop()
        wait_read(all_members, sender.acked, 120)
        stop_members(members)
        last = check_group_log(all_members, sender.acked)
        assert len(last) == 4, f"every partition committed: {last}"
        fresh = [
            start_member(c, group, topic, tmp_path / f"n{i}.log", "aiokafka") for i in range(2)
        ]
        all_members += fresh
        more = Sender(c.kafka_bootstrap, topic, 4, 100.0)
        more.start()
        time.sleep(2)
        more.stop()
        wait_read(all_members, sender.acked + more.acked, 120)
        assert first_reads(fresh) == last, "the new members start at the last commits"
        check_group_log(all_members, sender.acked + more.acked)
    finally:
        sender.halt()
        stop_members(all_members)


def test_kcat_commits_survive_the_coordinators_kill(make_cluster: Any) -> None:
    c = make_cluster(servers=3, env=ENV)
    c.create_topic("kklines", partitions=2, replication_factor=3)

    def consume() -> list[str]:  # every live server named: one was SIGKILLed
        bootstrap = ",".join(s.kafka_address for s in c.servers if s.alive)
        return kcat_consume(bootstrap, "kkgroup", "kklines", timeout_s=120)

    first = [f"a{i:03d}" for i in range(100)]
    kcat_produce(c.kafka_bootstrap, "kklines", first)
    assert consume() == sorted(first)
    coord = leader_of(c, GROUPS_TOPIC, partition_of("kkgroup"))
    c.kill(c.server(coord))
    second = [f"b{i:03d}" for i in range(50)]
    kcat_produce(c.kafka_bootstrap, "kklines", second)
    assert consume() == sorted(second), "the commits of the first run survived the kill"
