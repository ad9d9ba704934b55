"""Who may drop producer state, and what a drop leaves behind (docs/reliability.md,
findings 6 and 7).

Finding 7: renewals touch a PID's last use on the leader only, so a follower expiring on
its own clock forgets a live, renewing but idle producer, which then gets UNKNOWN_PID after
a failover. Followers never expire or evict; a replica becoming leader gives every PID a
full expiry period from then.

Finding 6: a partition remembers the newest last use of any PID it dropped
(``dropped_last_use_max_ms``, kept in snapshots), and a takeover's FENCE creates a fresh
entry only for a PID leased there after it.
"""

from __future__ import annotations

import asyncio
import struct
import time
import zlib
from array import array
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from partition_server.log_manager import LogManager
from partition_server.partition import Partition
from partition_server.producer_state import FenceOutcome, Outcome, ProducerStateTable
from partition_server.settings import ServerSettings
from partition_server.snapshot import MAGIC_V3, PartitionImage, Snapshot, decode, encode
from partition_server.testing import b as batch
from partition_server.testing import open_part, stored
from tests.helpers import ManualClock

EXPIRE_MS = 10_000


def follower(tmp_path: Path, clock: ManualClock, **limits: Any) -> Partition:
    """A replicated partition on this server, following server 2 (as recovery opens it)."""
    part = open_part(tmp_path, clock_ms=clock, expire_ms=EXPIRE_MS, **limits)
    part.become_follower(2, 1, "127.0.0.1:1")
    return part


def log_manager(tmp_path: Path, clock: ManualClock, part: Partition) -> LogManager:
    s = ServerSettings(
        data_dir=str(tmp_path / "server"), pid_expire_ms=EXPIRE_MS, allow_short_pid_expire=True
    )
    b = LogManager(s, None, clock_ms=clock)  # type: ignore[arg-type]  # no registry needed here
    b.partitions[("t", 0)] = part
    return b


# -- finding 7 ----------------------------------------------------------------------------
def test_follower_keeps_a_renewed_pid_and_the_new_leader_gives_it_a_full_period(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    part = follower(tmp_path, clock)
    b = log_manager(tmp_path, clock, part)
    assert part.append_replicated(stored([batch(7, 0, 3)]), [(1, 0)]) == 1
    part.set_high_watermark(3)  # the leader's next fetch answer: committed, not in flight
    # The producer stays idle but renews its lease on the leader (PRODUCER_STATE touches
    # the leader's state only) for three expiry periods.
    clock.now += 3 * EXPIRE_MS
    assert b.expire_pids(clock.now) == 0
    assert 7 in part.state, "a follower expired a PID on its own clock"
    part.become_leader(1, 2, [1, 2], [1, 2])  # the old leader died
    e = part.state.get(7)
    assert e is not None and e.last_use_ms == clock.now and e.durable_highwater == 2
    # A live producer renews within the new period; a dead one expires one period on.
    clock.now += EXPIRE_MS - 1
    assert b.expire_pids(clock.now) == 0 and 7 in part.state
    clock.now += 1
    assert b.expire_pids(clock.now) == 1 and 7 not in part.state
    assert part.state.dropped_last_use_max_ms == clock.now - EXPIRE_MS
    asyncio.run(part.flusher.wait_idle())
    part.close()


def test_follower_never_evicts_for_room_and_a_new_leader_evicts_no_live_pid(tmp_path: Path) -> None:
    clock = ManualClock()
    part = follower(tmp_path, clock, pids_max=1, evict_idle_min_ms=1_000)
    assert part.append_replicated(stored([batch(7, 0)]), [(1, 0)]) == 1
    part.set_high_watermark(1)
    clock.now += 5_000
    assert part.append_replicated(stored([batch(8, 0)], start=1), [(1, 0)]) == 1
    part.set_high_watermark(2)
    assert 7 in part.state and 8 in part.state, "a follower evicted PID 7 to make room"
    assert part.state.dropped_last_use_max_ms == 0
    part.become_leader(1, 2, [1, 2], [1, 2])
    # Right after the failover no PID has been idle for evict_idle_min_ms by this leader's
    # clock, so a new PID is refused rather than forgetting one that may be live.
    assert part.state.check_append(9, 0, 0, 1, clock.now).outcome is Outcome.TOO_MANY_PIDS
    clock.now += 1_000
    assert part.state.check_append(9, 0, 0, 1, clock.now).outcome is Outcome.APPEND
    part.state.apply_append(9, 0, 0, 1, 2, clock.now)
    assert len(part.state) == 1 and 9 in part.state
    assert part.state.dropped_last_use_max_ms == clock.now - 1_000
    asyncio.run(part.flusher.wait_idle())
    part.close()


def test_non_replicated_partition_still_expires(tmp_path: Path) -> None:
    clock = ManualClock()
    part = open_part(tmp_path, hw=None, clock_ms=clock, expire_ms=EXPIRE_MS)
    b = log_manager(tmp_path, clock, part)
    part.state.apply_append(7, 0, 0, 1, 0, clock.now, durable=True)
    clock.now += EXPIRE_MS
    assert b.expire_pids(clock.now) == 1
    part.close()


def test_raise_last_use_keeps_lru_order_and_later_times() -> None:
    t = ProducerStateTable(mode="strict")
    for pid, lu in ((1, 100), (2, 200), (3, 900)):
        t.apply_append(pid, 0, 0, 1, pid, lu, durable=True)
    t.raise_last_use(500)
    assert [(pid, t.get(pid).last_use_ms) for pid in t.pids()] == [  # type: ignore[union-attr]
        (1, 500),
        (2, 500),
        (3, 900),
    ]
    assert t.expire(500 + EXPIRE_MS, EXPIRE_MS) == 2 and t.pids() == [3]
    empty = ProducerStateTable()
    empty.raise_last_use(5)  # nothing to do, no error
    assert len(empty) == 0


def test_raise_last_use_of_a_million_pids_is_one_column_fill() -> None:
    n = 1_000_000
    t = ProducerStateTable(mode="strict")
    t.load_rows([(pid, 0, 0, pid, array("q", (0, 0, pid))) for pid in range(1, n + 1)])
    started = time.perf_counter()
    t.raise_last_use(2 * n)
    took = time.perf_counter() - started
    assert min(t._lu) == max(t._lu) == 2 * n
    print(f"raise_last_use of {n} PIDs: {took * 1000:.1f} ms")  # shown with -s


# -- finding 6: the horizon ---------------------------------------------------------------
def test_drops_raise_the_horizon_and_a_rebuild_keeps_it() -> None:
    t = ProducerStateTable(mode="strict", pids_max=1, evict_idle_min_ms=100)
    t.apply_append(1, 0, 0, 1, 0, 1_000, durable=True)
    t.apply_append(2, 0, 0, 1, 1, 1_050, durable=True)  # 1 is not idle enough to go
    assert len(t) == 2 and t.dropped_last_use_max_ms == 0
    assert t.expire(1_000 + EXPIRE_MS, EXPIRE_MS) == 1
    assert t.dropped_last_use_max_ms == 1_000
    t.apply_append(3, 0, 0, 1, 2, 1_200, durable=True)  # room for 3: 2 (idle 150 ms) goes
    assert 2 not in t and t.dropped_last_use_max_ms == 1_050
    t.clear()  # a rebuild from the log: drops stay dropped
    assert t.dropped_last_use_max_ms == 1_050
    t.note_dropped(900)
    assert t.dropped_last_use_max_ms == 1_050
    assert not t.may_create(1_050) and t.may_create(1_051)
    assert t.may_create(0), "0: the coordinator did not say (an older one): create as before"


def test_fence_creates_an_entry_only_for_a_pid_leased_after_the_horizon(tmp_path: Path) -> None:
    async def go() -> None:
        clock = ManualClock()
        part = open_part(tmp_path, hw=None, clock_ms=clock)
        part.state.note_dropped(5_000)
        answer = lambda existed, dhw, off: (existed, dhw, off)  # noqa: E731
        outcome, fut = part.fence(7, 3, True, answer, leased_since_ms=5_000)
        assert outcome is FenceOutcome.ABSENT and await fut == (False, -1, -1)
        assert 7 not in part.state and part.log.next_offset == 0, "nothing written"
        outcome, fut = part.fence(7, 3, True, answer, leased_since_ms=5_001)
        assert outcome is FenceOutcome.APPEND and await fut == (False, -1, 0)
        assert part.state.get(7).generation == 3  # type: ignore[union-attr]
        outcome, fut = part.fence(8, 1, True, answer)  # an older coordinator: as before
        assert outcome is FenceOutcome.APPEND and (await fut)[2] == 1
        await part.flusher.wait_idle()
        part.close()

    asyncio.run(go())


def test_horizon_survives_a_snapshot_and_older_files_read_their_creation_time(
    tmp_path: Path,
) -> None:
    snap = Snapshot(77_000, {("t", 0): PartitionImage(0, 0, [], 0, 42_000)})
    assert decode(encode(snap)) == snap
    # The PLSNAP03 layout: no horizon field; read as the file's created_ms.
    raw = encode(Snapshot(77_000, {("t", 0): PartitionImage(0, 0, [], 0, 0)}))
    body = bytearray(raw[20:])
    head = 8 + 4 + 2 + 1 + 4 + 8 + 8 + 8  # created, count, topic, partition .. truncations
    del body[head : head + 8]
    del body[head + 8 : head + 12]  # and PLSNAP05's count of durable highwaters (rows, words)
    old = MAGIC_V3 + struct.pack(">IQ", zlib.crc32(body), len(body)) + bytes(body)
    assert decode(old).partitions[("t", 0)].dropped_last_use_max_ms == 77_000
    # Recovery takes it from the snapshot, even when the rows are not trusted (a cut).
    part = open_part(
        tmp_path,
        hw=None,
        clock_ms=ManualClock(),
        snapshot=PartitionImage(0, 0, [], truncations=5, dropped_last_use_max_ms=42_000),
    )
    assert part.state.dropped_last_use_max_ms == 42_000
    part.close()


def test_capture_records_the_horizon(tmp_path: Path) -> None:
    async def go() -> None:
        clock = ManualClock()
        part = open_part(tmp_path, hw=None, clock_ms=clock)
        part.state.apply_append(7, 0, 0, 1, 0, 123, durable=True)
        part.state.expire(123 + EXPIRE_MS, EXPIRE_MS)
        img = await part.capture()
        assert img.dropped_last_use_max_ms == 123 and img.rows == []
        part.close()

    asyncio.run(go())


# -- the rules as properties ----------------------------------------------------------------
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 12), st.integers(0, 40)),
        st.tuples(st.just("expire"), st.just(0), st.integers(0, 40)),
        st.tuples(st.just("lead"), st.just(0), st.integers(0, 40)),
        st.tuples(st.just("follow"), st.just(0), st.just(0)),
    ),
    max_size=60,
)


@given(_OPS, st.integers(1, 6), st.sampled_from(["strict", "monotonic"]))
@settings(max_examples=300, deadline=None)
def test_only_a_leader_drops_and_the_horizon_is_the_newest_dropped_last_use(
    ops: list[tuple[str, int, int]], pids_max: int, mode: str
) -> None:
    """A reference model written from the rules, not the table: a PID's last use is the
    latest time it was applied (or the time its replica became leader); a follower never
    loses a PID; the horizon is the largest last use any lost PID had when it went."""
    t = ProducerStateTable(mode=mode, pids_max=pids_max, evict_idle_min_ms=30, expire_ms=50)
    now = 0
    last_use: dict[int, int] = {}
    seq: dict[int, int] = {}
    horizon = 0
    for op, pid, dt in ops:
        now += dt
        before = set(last_use)
        if op == "append":
            s = seq.get(pid, -1) + 1
            t.apply_append(pid, 0, s, 1, now, now, durable=True)
            seq[pid] = s
            last_use[pid] = max(last_use.get(pid, now), now)
        elif op == "expire":
            t.expire(now, 50)
        elif op == "lead" and not t.drops_allowed:
            t.drops_allowed = True
            t.raise_last_use(now)
            last_use = {p: max(lu, now) for p, lu in last_use.items()}
        elif op == "follow":
            t.drops_allowed = False
        gone = before - set(t.pids()) - ({pid} if op == "append" else set())
        if not t.drops_allowed:
            assert not gone, "a follower dropped producer state"
        for p in gone:
            horizon = max(horizon, last_use.pop(p))
            seq.pop(p)
        assert set(t.pids()) == set(last_use)
        assert t.dropped_last_use_max_ms == horizon
        for p, lu in last_use.items():
            assert t.get(p).last_use_ms == lu  # type: ignore[union-attr]
        if t.drops_allowed and op == "expire":
            assert all(lu + 50 > now for lu in last_use.values()), "expiry missed one"
