"""Partitions added to a topic after the lease service cached it (issue 25: CreatePartitions
from a Kafka admin client goes to a partition server and ZooKeeper, not through this
coordinator): a lease of a new partition, alone or in a renewal round with the old ones,
is granted, not refused UNKNOWN_TOPIC_OR_PARTITION for good by the cached count. Before
the fix the SDK producer never took up a topic's new partitions."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.leases import LeaseRequest
from pidlease.errors import UnknownTopicOrPartition
from tests.unit.coordinator.test_service import env, lease  # noqa: F401 - env is a fixture


def test_a_partition_added_after_the_topic_was_cached_can_be_leased(env: Any) -> None:  # noqa: F811
    svc, store, _leaders, _clock = env
    r = lease(svc)  # the topic "t" (4 partitions) is cached now
    pid, gen = r.record.pid, r.record.generation
    with pytest.raises(UnknownTopicOrPartition):
        lease(svc, partition=4, pid=pid, generation=gen)
    store.add_topic("t", 6)  # grown in ZooKeeper by someone else
    got = lease(svc, partition=5, pid=pid, generation=gen)
    assert got.record.pid == pid and got.record.generation == gen
    # A renewal round naming old and new partitions: every item answered with a lease.
    answers = svc.lease_batch(
        [LeaseRequest(topic="t", partition=p, pid=pid, generation=gen) for p in range(6)]
    )
    assert all("lease_token" in a for a in answers), answers
    with pytest.raises(UnknownTopicOrPartition):
        lease(svc, partition=6, pid=pid, generation=gen)  # still beyond: refused


def test_a_renewal_round_without_the_address_cache_answers_every_item() -> None:
    # The leaders' addresses were read from ZooKeeper, put in the cache and read back from
    # it; with the cache off (leader_address_cache_ms=0), or an entry dropped or expired
    # by another request in between, a partition had no answer at all and the round died
    # on a KeyError (seen once in test_sdk_producer_new_partitions: "internal error
    # (KeyError)" for a renewal, a retriable failure only by luck of the catch-all).
    from coordinator.allocator import PidAllocator
    from coordinator.metrics import Metrics
    from coordinator.service import LeaseService
    from coordinator.settings import CoordinatorSettings
    from coordinator.testing import FakeStore
    from tests.helpers import ManualClock
    from tests.unit.coordinator.test_service import FakeLeaders

    store, leaders, clock = FakeStore(), FakeLeaders(), ManualClock()
    store.add_topic("t", 4)
    store.add_server(1, 9001)
    svc = LeaseService(
        CoordinatorSettings(zk="x", pid_block_size=10, leader_address_cache_ms=0),
        store,
        PidAllocator(store, 10),
        leaders,
        Metrics(),  # type: ignore[arg-type]
        clock_ms=clock,
    )
    try:
        r = lease(svc)
        pid, gen = r.record.pid, r.record.generation
        answers = svc.lease_batch(
            [LeaseRequest(topic="t", partition=p, pid=pid, generation=gen) for p in range(4)]
        )
        assert all("lease_token" in a for a in answers), answers
    finally:
        svc.close()
