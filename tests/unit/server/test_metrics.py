"""The partition server's metrics without a server: counters and events per append outcome,
the latency histogram, label escaping, the producer-state memory estimate against what
tracemalloc measures, and the HTTP listener's answers (including to bad clients)."""

from __future__ import annotations

import asyncio
import gc
import random
import tracemalloc
from typing import Any

import pytest

from partition_server import metrics as M
from partition_server import metrics_listener as L
from partition_server.producer_state import ProducerStateTable


def scrape(m: M.ServerMetrics) -> dict[Any, float]:
    return M.parse_text(m.render())


def test_each_outcome_counts_once_and_only_fenced_and_duplicates_become_events() -> None:
    rng = random.Random(7)
    m = M.ServerMetrics(3, clock_ms=lambda: 1000)
    want = {
        "FENCED": 0,
        "DUPLICATE": 0,
        "OUT_OF_ORDER_SEQUENCE": 0,
        "UNKNOWN_PID": 0,
        "SEQUENCE_UNKNOWN": 0,
    }
    records = 0
    for i in range(500):
        if rng.random() < 0.3:
            n = rng.randint(1, 9)
            m.appended(n)
            records += n
            continue
        outcome = rng.choice(sorted(want))
        want[outcome] += 1
        m.refused(outcome, "t", i % 3, pid=10 + i, generation=2, base_sequence=i, count=1)
    m.fenced("t", 0, pid=5, generation=9)
    s = scrape(m)
    assert M.sample(s, "pidlease_server_fenced_appends_total") == want["FENCED"]
    assert M.sample(s, "pidlease_server_duplicates_total") == want["DUPLICATE"]
    assert M.sample(s, "pidlease_server_out_of_order_total") == want["OUT_OF_ORDER_SEQUENCE"]
    assert M.sample(s, "pidlease_server_unknown_pid_total") == want["UNKNOWN_PID"]
    assert M.sample(s, "pidlease_server_sequence_unknown_total") == want["SEQUENCE_UNKNOWN"]
    assert M.sample(s, "pidlease_server_appended_records_total") == records
    assert M.sample(s, "pidlease_server_fences_total") == 1
    kinds = [e["kind"] for e in m.events]
    assert kinds.count("fenced_append") == min(want["FENCED"], len(kinds))
    assert set(kinds) <= {"fenced_append", "duplicate", "fence"}
    assert m.events[-1] == {
        "id": m.events[-1]["id"],
        "kind": "fence",
        "time_ms": 1000,
        "server_id": 3,
        "topic": "t",
        "partition": 0,
        "pid": 5,
        "generation": 9,
    }


def test_the_event_feed_is_bounded_and_ids_never_repeat() -> None:
    m = M.ServerMetrics(1, events_kept=5)
    for i in range(12):
        m.refused("DUPLICATE", "t", 0, pid=1, generation=0, base_sequence=i, count=1)
    assert [e["base_sequence"] for e in m.events] == list(range(7, 12))
    assert len({e["id"] for e in m.events}) == 5
    assert m.duplicates == 12
    assert len(m.summary()["events"]) == 5


def test_latency_is_observed_only_for_batches_that_were_acked() -> None:
    async def go() -> M.ServerMetrics:
        m = M.ServerMetrics(1)
        loop = asyncio.get_running_loop()
        futs = [loop.create_future() for _ in range(3)]
        for f in futs:
            m.appended(1, started_s=0.0, durable=f)
        futs[0].set_result(b"ack")
        futs[1].set_exception(RuntimeError("lost leadership"))
        futs[2].cancel()
        await asyncio.sleep(0)
        futs[1].exception()  # retrieved: no "never retrieved" warning
        return m

    m = asyncio.run(go())
    s = scrape(m)
    assert M.sample(s, "pidlease_server_append_latency_seconds_count") == 1
    assert M.sample(s, "pidlease_server_append_latency_seconds_bucket", le="+Inf") == 1
    # started at perf_counter 0: the observation is huge, so only +Inf holds it
    assert M.sample(s, "pidlease_server_append_latency_seconds_bucket", le="10.0") == 0
    assert M.sample(s, "pidlease_server_appended_batches_total") == 3


def test_histogram_buckets_are_cumulative() -> None:
    h = M.Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 2.0, 3.0):
        h.observe(v)
    s = M.parse_text("\n".join(h.render("x")))
    assert [M.sample(s, "x_bucket", le=le) for le in ("0.1", "1.0", "+Inf")] == [2, 3, 5]
    assert M.sample(s, "x_sum") == pytest.approx(5.65)


def test_labelled_gauges_escape_and_a_broken_gauge_hides_nothing_else() -> None:
    m = M.ServerMetrics(1)
    odd = 'we"ird\\topic\nname'
    m.gauge(
        "pidlease_server_tracked_pids_by_partition",
        "per partition",
        lambda: {(odd, "0"): 4, ("plain", "1"): 2.5},
        labels=("topic", "partition"),
    )

    def broken() -> float:
        raise RuntimeError("bug")

    m.gauge("pidlease_server_broken", "raises", broken)
    m.gauge("pidlease_server_tracked_pids", "total", lambda: 6)
    s = scrape(m)
    assert M.sample(s, "pidlease_server_tracked_pids_by_partition", topic=odd, partition="0") == 4
    assert (
        M.sample(s, "pidlease_server_tracked_pids_by_partition", topic="plain", partition="1")
        == 2.5
    )
    assert M.sample(s, "pidlease_server_tracked_pids") == 6
    assert not any(name == "pidlease_server_broken" for name, _ in s)
    assert m.summary()["tracked_pids"] == 6


def test_parse_text_refuses_garbage() -> None:
    with pytest.raises(ValueError, match="not a sample: 'just_a_name_and_no_value'"):
        M.parse_text("just_a_name_and_no_value")


def test_state_memory_estimate_is_close_to_what_tracemalloc_measures() -> None:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        table = ProducerStateTable(batches_kept=5)
        for pid in range(1_000_000, 1_020_000):
            for b in range(6):
                table.apply_append(pid, 7, b * 10, 10, pid * 100 + b * 10, 1_700_000_000_000 + pid)
        table.mark_durable(2**62)
        measured = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    estimate = M.estimate_state_bytes(table)
    assert len(table) == 20_000
    assert 0.6 * measured <= estimate <= 1.6 * measured, (estimate, measured)
    assert M.estimate_state_bytes(ProducerStateTable()) < 2000  # empty columns and dicts


def test_resident_memory_is_read() -> None:
    assert M.resident_memory_bytes() > 1_000_000


async def _http(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return data


def test_listener_serves_metrics_and_refuses_everything_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(L, "REQUEST_TIMEOUT_S", 0.3)
    m = M.ServerMetrics(1)
    m.refused("FENCED", "t", 0, pid=1, generation=0, base_sequence=0, count=1)

    async def go() -> dict[str, bytes]:
        lst = L.MetricsListener(m.render, "127.0.0.1", 0)
        await lst.start()
        try:
            got = {
                "metrics": await _http(lst.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
                "health": await _http(lst.port, b"GET /healthz HTTP/1.1\r\n\r\n"),
                "post": await _http(lst.port, b"POST /metrics HTTP/1.1\r\n\r\n"),
                "other": await _http(lst.port, b"GET /nope HTTP/1.1\r\n\r\n"),
                "huge": await _http(
                    lst.port, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n"
                ),
                "silent": await _http(lst.port, b"GET /metr"),
            }
            assert lst.scrapes == 1
            return got
        finally:
            await lst.stop()

    got = asyncio.run(go())
    head, _, body = got["metrics"].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"text/plain; version=0.0.4" in head
    assert M.sample(M.parse_text(body.decode()), "pidlease_server_fenced_appends_total") == 1
    assert got["health"].startswith(b"HTTP/1.1 200")
    assert got["post"].startswith(b"HTTP/1.1 405")
    assert got["other"].startswith(b"HTTP/1.1 404")
    assert got["huge"].startswith(b"HTTP/1.1 400")
    assert got["silent"].startswith(b"HTTP/1.1 400")


def test_broker_gauges_from_a_stand_in_broker() -> None:
    from types import SimpleNamespace

    from partition_server.isr import InSyncReplicas

    def part(topic: str, p: int, role: str, pids: int, **kw: Any) -> Any:
        st = ProducerStateTable()
        for pid in range(1, pids + 1):
            st.apply_append(pid, 0, 0, 1, pid, 0, durable=True)
        return SimpleNamespace(
            topic=topic,
            partition=p,
            role=role,
            hosted=True,
            state=st,
            isr=kw.get("isr"),
            isr_clock_ms=lambda: 6_000,  # the in-sync set's (monotonic) clock
            log=SimpleNamespace(next_offset=kw.get("end", 0)),
        )

    isr = InSyncReplicas(1, [1, 2, 3], [1, 2], now_ms=1_000)
    isr.record_fetch(2, 90, 100, now_ms=4_000)  # 10 behind, not caught up since 1 s
    log_manager = SimpleNamespace(
        partitions={
            ("a", 0): part("a", 0, "leader", 3, isr=isr, end=100),
            ("a", 1): part("a", 1, "follower", 2),
            ("b", 0): part("b", 0, "leader", 0),
        },
        clock_ms=lambda: 6_000,
        _last_snapshot_ms=1_500,
        snapshots_taken=4,
        replicas=SimpleNamespace(isr_changes={("a", 0): (3, 2), ("a", 1): (1, 0)}),
    )
    log_manager.partitions[("a", 1)].state.expired_total = 7
    log_manager.partitions[("a", 0)].state.refused_total = 3
    log_manager.partitions[("b", 0)].state.evicted_total = 2
    log_manager.partitions[("a", 0)].min_insync_refusals = 5
    m = M.ServerMetrics(1)
    M.watch_log_manager(m, log_manager)
    s = scrape(m)
    assert M.sample(s, "pidlease_server_tracked_pids") == 5
    assert M.sample(s, "pidlease_server_tracked_pids_by_partition", topic="a", partition="1") == 2
    assert M.sample(s, "pidlease_server_partitions", role="leader") == 2
    assert M.sample(s, "pidlease_server_snapshot_age_seconds") == 4.5
    assert M.sample(s, "pidlease_server_snapshots_total") == 4
    assert M.sample(s, "pidlease_server_pids_expired_total") == 7
    assert M.sample(s, "pidlease_server_pids_evicted_total") == 2
    assert M.sample(s, "pidlease_server_pid_limit_refusals_total") == 3
    assert M.sample(s, "pidlease_server_min_insync_refusals_total") == 5
    assert M.sample(s, "pidlease_server_under_min_isr_partitions") == 0  # 2 in sync, min 1
    isr.min_insync = 3
    assert M.sample(scrape(m), "pidlease_server_under_min_isr_partitions") == 1
    assert (
        M.sample(s, "pidlease_server_replica_lag_offsets", topic="a", partition="0", replica="2")
        == 10
    )
    assert (
        M.sample(s, "pidlease_server_replica_lag_offsets", topic="a", partition="0", replica="3")
        == -1
    )
    assert (
        M.sample(s, "pidlease_server_replica_lag_seconds", topic="a", partition="0", replica="3")
        == 5
    )
    assert M.sample(s, "pidlease_server_under_replicated_partitions") == 1
    assert M.sample(s, "pidlease_server_isr_shrinks_total", topic="a", partition="0") == 3
    assert M.sample(s, "pidlease_server_isr_expands_total", topic="a", partition="0") == 2
    # kept from when it led; a partition without a change shows 0, not nothing
    assert M.sample(s, "pidlease_server_isr_shrinks_total", topic="a", partition="1") == 1
    assert M.sample(s, "pidlease_server_isr_expands_total", topic="b", partition="0") == 0
    assert 0 < M.sample(s, "pidlease_server_producer_state_bytes") < 100_000
    assert M.sample(s, "process_resident_memory_bytes") > 0
    assert m.summary()["tracked_pids"] == 5 and m.summary()["snapshot_age_seconds"] == 4.5


def test_log_gauges_and_retention_counters_per_partition_from_a_real_broker(
    tmp_path: Any,
) -> None:
    """Size, start, end and segments per partition match the log on disk, and what
    retention deletes is counted per partition, in /metrics and in METADATA alike."""
    from partition_server.log_manager import LogManager
    from partition_server.retention import LogPolicy
    from partition_server.settings import ServerSettings
    from partition_server.testing import open_part
    from pidlease.wire import protocol as P
    from tests.helpers import ManualClock

    seg = 4096
    clock = ManualClock(100 * 3_600_000)
    policy = LogPolicy(retention_bytes=2 * seg, segment_bytes=seg)

    async def go() -> None:
        part = open_part(tmp_path, hw=None, clock_ms=clock, policy=policy)
        part.hosted = True
        b = LogManager(ServerSettings(data_dir=str(tmp_path)), None, clock_ms=clock)  # type: ignore[arg-type]
        b.partitions[("t", 0)] = part
        m = M.ServerMetrics(1)
        M.watch_log_manager(m, b)
        for seq in range(40):
            raw = bytearray(
                P.encode_batch(
                    [(None, b"x" * 600)],
                    pid=7,
                    generation=0,
                    base_sequence=seq,
                    timestamp_ms=clock.now,
                )
            )
            part.append(
                memoryview(raw),
                P.validate_batch(bytes(raw)),
                lambda *_: None,
                epoch=part.leader_epoch,
            )
        await part.wait_durable(part.log.next_offset)
        s = scrape(m)
        at = {"topic": "t", "partition": "0"}
        before = part.log.size_bytes
        assert M.sample(s, "pidlease_server_log_size_bytes", **at) == before > 4 * seg
        assert M.sample(s, "pidlease_server_log_start_offset", **at) == 0
        assert M.sample(s, "pidlease_server_log_end_offset", **at) == part.log.next_offset == 40
        segments = len(part.log.segments)
        assert M.sample(s, "pidlease_server_log_segments", **at) == segments > 4
        assert M.sample(s, "pidlease_server_log_segments_deleted_total", **at) == 0
        assert M.sample(s, "pidlease_server_log_bytes_deleted_total", **at) == 0

        await b.snapshot_now()
        n = await b.apply_retention(clock.now)
        assert n > 0
        s = scrape(m)
        after = part.log.size_bytes
        assert M.sample(s, "pidlease_server_log_size_bytes", **at) == after < before
        assert (
            M.sample(s, "pidlease_server_log_start_offset", **at) == part.log.log_start_offset > 0
        )
        assert M.sample(s, "pidlease_server_log_end_offset", **at) == 40
        assert M.sample(s, "pidlease_server_log_segments", **at) == segments - n
        assert M.sample(s, "pidlease_server_log_segments_deleted_total", **at) == n
        assert M.sample(s, "pidlease_server_log_bytes_deleted_total", **at) == before - after
        entry = b.metadata(1, "here")["partitions"][0]
        assert (entry["segments_deleted"], entry["bytes_deleted"]) == (n, before - after)
        assert entry["log_start_offset"] == part.log.log_start_offset
        # A partition that leaves takes its series with it (bounded cardinality) ...
        del b.partitions[("t", 0)]
        assert not any(name.startswith("pidlease_server_log_") for name, _ in scrape(m))
        # ... and one that comes back resumes its counters rather than restart them.
        b.partitions[("t", 0)] = part
        assert M.sample(scrape(m), "pidlease_server_log_segments_deleted_total", **at) == n
        await part.flusher.wait_idle()
        part.close()

    asyncio.run(go())
