"""PID blocks (coordinator/allocator.py) against an in-memory counter with ZooKeeper's
version semantics; tests/integration/test_coordinator_allocator.py runs the same against
the real ZooKeeper."""

from __future__ import annotations

import threading

import pytest

from coordinator.allocator import CAS_ATTEMPTS, FIRST_PID, PidAllocator
from partition_server.kafka.pids import KafkaPids, PidError
from pidlease.errors import CoordinatorUnavailable
from pidlease.wire.cluster import PID_BLOCK
from pidlease.wire.kafka_errors import UNKNOWN_SERVER_ERROR
from pidlease.wire.pid_blocks import ZkCounter
from pidlease.wire.protocol import MAX_PID
from tests.sim.zk import FakeZk


class FakeCounter:
    """A znode: value + version; set succeeds only on the current version. ``steal`` makes
    another allocator win the next N compare-and-sets, as a concurrent coordinator would."""

    def __init__(self, value: int | None = None) -> None:
        self.value = value
        self.version = 0
        self.lock = threading.Lock()
        self.steal = 0
        self.writes = 0

    def read_counter(self) -> tuple[int | None, int]:
        with self.lock:
            return self.value, self.version

    def create_counter(self, value: int) -> bool:
        with self.lock:
            self.writes += 1
            if self.value is not None:
                return False
            self.value, self.version = value, 0
            return True

    def cas_counter(self, value: int, version: int) -> bool:
        with self.lock:
            self.writes += 1
            if self.steal > 0:
                self.steal -= 1
                assert self.value is not None
                self.value += 1000
                self.version += 1
                return False
            if version != self.version:
                return False
            self.value = value
            self.version += 1
            return True


def test_first_block_starts_at_one_and_is_handed_out_in_order() -> None:
    counter = FakeCounter()
    alloc = PidAllocator(counter, block_size=3)
    assert [alloc.next_pid() for _ in range(7)] == [1, 2, 3, 4, 5, 6, 7]
    assert alloc.blocks_fetched == 3
    assert counter.value == 10
    assert counter.writes == 3, "one ZooKeeper write per block, not per PID"


def test_block_size_one_still_unique() -> None:
    alloc = PidAllocator(FakeCounter(), block_size=1)
    assert [alloc.next_pid() for _ in range(5)] == [1, 2, 3, 4, 5]


def test_two_allocators_on_one_counter_never_overlap() -> None:
    counter = FakeCounter()
    a = PidAllocator(counter, block_size=10)
    b = PidAllocator(counter, block_size=10)
    got = [a.next_pid() if i % 3 else b.next_pid() for i in range(500)]
    assert len(set(got)) == len(got)
    assert min(got) >= FIRST_PID


def test_restart_wastes_rest_of_block_but_never_reuses() -> None:
    counter = FakeCounter()
    first = PidAllocator(counter, block_size=100)
    before = [first.next_pid() for _ in range(5)]
    # "Crash": a new allocator (new process) on the same counter.
    second = PidAllocator(counter, block_size=100)
    after = [second.next_pid() for _ in range(5)]
    assert after[0] == 101
    assert not set(before) & set(after)


def test_lost_compare_and_set_rereads_and_skips_the_winners_block() -> None:
    counter = FakeCounter(FIRST_PID)
    alloc = PidAllocator(counter, block_size=10)
    counter.steal = 2
    pid = alloc.next_pid()
    assert pid == 1 + 2000, "starts after the two blocks the other coordinator took"
    assert alloc.cas_conflicts == 2


def test_endless_conflicts_give_a_retriable_error() -> None:
    counter = FakeCounter(FIRST_PID)
    counter.steal = 10**9
    alloc = PidAllocator(counter, block_size=10, attempts_max=5)
    with pytest.raises(CoordinatorUnavailable):
        alloc.next_pid()


def test_exhausted_pid_space_is_refused() -> None:
    alloc = PidAllocator(FakeCounter(MAX_PID - 1), block_size=10)
    with pytest.raises(CoordinatorUnavailable, match="every 63-bit PID"):
        alloc.next_pid()


def test_many_threads_get_distinct_pids() -> None:
    counter = FakeCounter()
    allocs = [PidAllocator(counter, block_size=7) for _ in range(3)]
    out: list[int] = []
    lock = threading.Lock()

    def work(alloc: PidAllocator) -> None:
        mine = [alloc.next_pid() for _ in range(300)]
        with lock:
            out.extend(mine)

    threads = [threading.Thread(target=work, args=(allocs[i % 3],)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(out) == 12 * 300
    assert len(set(out)) == len(out)


def test_one_retry_limit_for_every_reserver() -> None:
    """Issue 28: the coordinator gave up after 10,000 conflicts, the partition servers'
    InitProducerId after 1,000; one reservation now, one limit (pidlease/wire/pid_blocks.py
    says why 1,000)."""
    counter = FakeCounter(FIRST_PID)
    counter.steal = 10**9
    with pytest.raises(CoordinatorUnavailable, match=f"after {CAS_ATTEMPTS} "):
        PidAllocator(counter, block_size=10).next_pid()
    assert counter.writes == CAS_ATTEMPTS == 1_000


def test_kafka_init_producer_id_and_http_leases_share_the_counter_and_its_checks() -> None:
    zk = FakeZk()
    kafka = KafkaPids(zk.client("server-1"), block_size=5)
    coord = PidAllocator(ZkCounter(zk.client("coordinator")), block_size=7)
    pids = []
    for _ in range(4):
        pids += [kafka.init("alice").pid for _ in range(6)]
        pids += [coord.next_pid() for _ in range(8)]
    assert len(set(pids)) == len(pids) and min(pids) == FIRST_PID
    # The counter is the end of the last block either reserved.
    assert int(zk.nodes[PID_BLOCK].data) == max(kafka._blocks._end, coord._end)
    # A damaged counter is refused the same way by both (a Kafka client sees
    # UNKNOWN_SERVER_ERROR, an HTTP client a 503).
    zk.nodes[PID_BLOCK].data = b"0"
    fresh = KafkaPids(zk.client("server-2"), block_size=5)
    with pytest.raises(PidError, match="damaged") as err:
        fresh.init("alice")
    assert err.value.code == UNKNOWN_SERVER_ERROR
    with pytest.raises(CoordinatorUnavailable, match="damaged"):
        PidAllocator(ZkCounter(zk.client("coordinator-2")), block_size=7).next_pid()
