"""The write's columnar path (``pidlease.spark.columnar``) against the pure reference
(``pidlease.spark.sequencing.plan``): the same rows give the records the reference plans
(keys, values, sequences, topic partitions, producers by bucket), whatever the order and
batching they come in; a retry or a replayed micro-batch in another order resumes after
what is durable with every row once; and ``encode_columns`` gives the same bytes as
``encode``."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
import zlib
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pidlease.client.producer import AsyncProducer
from pidlease.spark.attempt import Attempt, SharedTransport, TaskInfo
from pidlease.spark.columnar import ColumnarAttempt
from pidlease.spark.encoding import RecordEncoder, key_bytes, value_bytes
from pidlease.spark.errors import InjectedFailure, PipelineError, StreamIdentityError
from pidlease.spark.options import WriteSettings
from pidlease.spark.sequencing import BUCKET_COLUMN, HASH_COLUMN, Routing, Row, plan
from pidlease.testing.fakes import FakeCoordinator, FakePartitionServer, fake_cluster

pa = pytest.importorskip("pyarrow")

TOPICS = {"t": (3, "strict")}
STREAM_TOPICS = {"t": (3, "monotonic")}  # a stream's ids leave holes
BUCKETS = 4


def _use_fake(
    monkeypatch: pytest.MonkeyPatch, coord: FakeCoordinator, *, renew: bool = False
) -> None:
    """Attempts lease from ``coord``; with ``renew``, through the attempt's transport, so a
    micro-batch's first attempt renews its producers (else every lease is by name)."""

    def _open(self: Attempt, name: str, transport: SharedTransport) -> AsyncProducer:
        transport.real = coord.transport()  # behind the renewing view
        s = self.settings
        return AsyncProducer(
            "http://fake",
            topic=s.topic,
            producer_name=name,
            batch_records_max=s.batch_records_max,
            http_transport=transport.view if renew else coord.transport(),
        )

    def current(self: Attempt, names: list[str]) -> dict[str, tuple[int, int]]:
        return {n: (coord.names[n], coord.pids[coord.names[n]]) for n in names if n in coord.names}

    monkeypatch.setattr(Attempt, "_open", _open)
    monkeypatch.setattr(Attempt, "current_leases", current)


def _settings(partitioning: str = "auto") -> WriteSettings:
    return WriteSettings.parse(
        {
            "coordinator": "http://fake",
            "topic": "t",
            "job_name": "J",
            "partitioning": partitioning,
            "buckets": str(BUCKETS),
        }
    )


def _log(srv: FakePartitionServer) -> list[list[tuple[Any, ...]]]:
    return [[(r.key, r.value, r.sequence_id, r.pid) for r in srv.records("t", p)] for p in range(3)]


def _in_log(srv: FakePartitionServer) -> Counter[bytes]:
    return Counter(v for part in _log(srv) for _k, v, _s, _p in part)


ENC = RecordEncoder.for_columns([("key", "string"), ("value", "string")])


def _hash(key: str | None, value: str) -> int:
    return zlib.crc32(f"{key}\0{value}".encode()) & 0x7F  # 7 bits: ties on the hash


def _batches(keys: list[str | None], values: list[str], size: int) -> list[Any]:
    """Arrow batches with the row hash and bucket columns ``pidlease.spark.bucketed`` adds."""
    hashes = [_hash(k, v) for k, v in zip(keys, values, strict=True)]
    return [
        pa.record_batch(
            {
                "key": pa.array(keys[i : i + size], pa.string()),
                "value": values[i : i + size],
                HASH_COLUMN: pa.array(hashes[i : i + size], pa.int64()),
                BUCKET_COLUMN: pa.array([h % BUCKETS for h in hashes[i : i + size]], pa.int32()),
            }
        )
        for i in range(0, len(keys), size)
    ]


def _shuffled(keys: list[str | None], values: list[str], seed: int) -> tuple[list, list]:
    pairs = list(zip(keys, values, strict=True))
    random.Random(seed).shuffle(pairs)
    return [k for k, _ in pairs], [v for _, v in pairs]


@pytest.mark.parametrize("batch_id", [None, 7], ids=["batch", "micro-batch"])
@pytest.mark.parametrize("partitioning", ["auto", "spark"])
def test_columnar_path_writes_what_the_reference_plans(
    monkeypatch: pytest.MonkeyPatch, partitioning: str, batch_id: int | None
) -> None:
    keys = [None if i % 7 == 0 else f"customer-{i % 13}" for i in range(500)]
    values = [f"v{i % 450}" * (i % 5) for i in range(500)]  # some rows repeat
    with fake_cluster(TOPICS if batch_id is None else STREAM_TOPICS) as (srv, coord):
        _use_fake(monkeypatch, coord)
        task = TaskInfo(spark_partition=4, attempt=0, batch_id=batch_id, query_id="q")
        k2, v2 = _shuffled(keys, values, 1)
        commit = ColumnarAttempt(_settings(partitioning), task).run_columns(
            ENC, _batches(k2, v2, 64)
        )
        got = {(k, v, s) for part in _log(srv) for k, v, s, _p in part}
        by_tp = [{(k, v, s) for k, v, s, _p in part} for part in _log(srv)]
    rows = [
        Row(
            _hash(k, v) % BUCKETS,
            _hash(k, v),
            None if k is None else k.encode(),
            v.encode(),
        )
        for k, v in zip(keys, values, strict=True)
    ]
    ref = plan(rows, routing=Routing(partitioning), partitions=3, batch_id=batch_id, resume={})
    assert commit.appended == commit.rows == 500
    assert sorted(commit.buckets) == sorted({r.bucket for r in rows})
    assert got == {(r.key, r.value, r.sequence) for r in ref}
    for tp in range(3):
        assert by_tp[tp] == {(r.key, r.value, r.sequence) for r in ref if r.topic_partition == tp}


def test_a_micro_batch_replayed_in_another_order_writes_every_row_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 30: before, ids were positions in delivery order, and a replay in another
    order skipped rows never written and appended rows already written."""
    keys = [f"k{i % 5}" for i in range(300)]
    values = [f"v{i}" for i in range(300)]
    with fake_cluster(STREAM_TOPICS) as (srv, coord):
        _use_fake(monkeypatch, coord)
        # micro-batch 1 of the query, written whole
        ColumnarAttempt(_settings(), TaskInfo(0, 0, batch_id=1, query_id="q")).run_columns(
            ENC, _batches(keys, values, 50)
        )

        def boom() -> None:
            raise InjectedFailure("injected")

        with pytest.raises(InjectedFailure):
            ColumnarAttempt(_settings(), TaskInfo(0, 0, batch_id=2, query_id="q")).run_columns(
                ENC, _batches(keys, values, 50), {120: boom}
            )
        # the replay (after a restart from the checkpoint): the same rows in another
        # order, in other batches, in another Spark partition
        k2, v2 = _shuffled(keys, values, 2)
        commit = ColumnarAttempt(_settings(), TaskInfo(3, 0, batch_id=2, query_id="q")).run_columns(
            ENC, _batches(k2, v2, 70)
        )
        assert commit.rows == 300
        assert 0 < commit.skipped < 300  # rows before the kill were durable
        assert commit.appended == commit.sent == 300 - commit.skipped
        got = _in_log(srv)
    assert got == Counter(v.encode() for v in values * 2)  # every row of both batches once


def test_a_retry_in_another_order_resumes_after_what_is_durable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = [f"k{i % 5}" for i in range(300)]
    values = [f"v{i % 280}" for i in range(300)]  # 20 rows twice: both copies written
    with fake_cluster(TOPICS) as (srv, coord):
        _use_fake(monkeypatch, coord)

        def boom() -> None:
            raise InjectedFailure("injected")

        with pytest.raises(InjectedFailure):
            ColumnarAttempt(_settings(), TaskInfo(0, 0)).run_columns(
                ENC, _batches(keys, values, 50), {120: boom}
            )
        k2, v2 = _shuffled(keys, values, 3)
        commit = ColumnarAttempt(_settings(), TaskInfo(0, 1)).run_columns(ENC, _batches(k2, v2, 33))
        assert commit.rows == 300
        assert commit.skipped + commit.sent == 300
        assert commit.skipped > 0  # rows before the failure were durable: not sent again
        assert commit.appended == commit.sent
        assert commit.fenced_attempts  # the retry's takeover found attempt 0's rows
        got = _in_log(srv)
    assert got == Counter(v.encode() for v in values)  # every row once, copies twice


def test_a_stream_under_a_job_name_another_query_used_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 30: a fresh checkpoint restarts batch ids at 0; under a used job_name every
    row was skipped as already written, silently."""
    keys, values = ["a", "b"], ["1", "2"]
    with fake_cluster(STREAM_TOPICS) as (srv, coord):
        _use_fake(monkeypatch, coord)
        for batch_id in (0, 1, 2):
            ColumnarAttempt(_settings(), TaskInfo(0, 0, batch_id=batch_id)).run_columns(
                ENC, _batches([f"{k}{batch_id}" for k in keys], values, 2)
            )
        # a new query (fresh checkpoint: batch 0) whose rows fall in buckets written before
        with pytest.raises(StreamIdentityError, match=r"checkpointLocation.*new job_name"):
            ColumnarAttempt(_settings(), TaskInfo(0, 0, batch_id=0)).run_columns(
                ENC, _batches(["a1", "b1"], values, 2)
            )
        assert sum(_in_log(srv).values()) == 6


def test_the_sink_plans_a_plain_dataframe_with_a_warning_and_bucketed_rows_as_before(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No refusal of a plain DataFrame (the contract's example): ``bucketed=False`` and one
    warning naming what it leaves to the split; bucketed rows keep their bucket count."""
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

    from pidlease.spark.sequencing import BUCKETS_METADATA
    from pidlease.spark.sink import bucketed_settings

    plain = StructType([StructField("value", StringType())])
    with caplog.at_level("WARNING", logger="pidlease.spark.sink"):
        got = bucketed_settings(_settings(), plain)
    assert got.bucketed is False
    [warning] = [r for r in caplog.records if r.name == "pidlease.spark.sink"]
    assert "pidlease.spark.bucketed(df)" in warning.getMessage()
    assert "pidlease-spark publish" in warning.getMessage()
    bucketed = StructType(
        [
            StructField("value", StringType()),
            StructField(HASH_COLUMN, LongType()),
            StructField(BUCKET_COLUMN, IntegerType(), metadata={BUCKETS_METADATA: 16}),
        ]
    )
    got = bucketed_settings(_settings(), bucketed)
    assert (got.bucketed, got.buckets) == (True, 16)
    half = StructType([StructField("value", StringType()), StructField(HASH_COLUMN, LongType())])
    with pytest.raises(PipelineError, match="only one of"):
        bucketed_settings(_settings(), half)


def test_a_bucketed_write_refuses_rows_without_the_bucket_columns() -> None:
    """``bucketed`` settings (the sink saw the columns in the schema) with rows lacking
    them: a clear error, never rows numbered as a plain partition."""
    batch = pa.record_batch({"key": pa.array(["a"]), "value": pa.array(["1"])})
    with pytest.raises(PipelineError, match=r"pidlease.spark.bucketed\(df\)"):
        ColumnarAttempt(_settings(), TaskInfo(0, 0)).run_columns(ENC, [batch])


def _plain(settings: WriteSettings) -> WriteSettings:
    """What the sink plans for a plain DataFrame (no ``pidlease.spark.bucketed`` columns)."""
    return dataclasses.replace(settings, bucketed=False)


def _plain_batches(keys: list[str | None], values: list[str], size: int) -> list[Any]:
    return [
        pa.record_batch(
            {"key": pa.array(keys[i : i + size], pa.string()), "value": values[i : i + size]}
        )
        for i in range(0, len(keys), size)
    ]


@pytest.mark.parametrize("batch_id", [None, 7], ids=["batch", "micro-batch"])
@pytest.mark.parametrize("partitioning", ["auto", "spark"])
def test_a_plain_partition_in_two_orders_gets_the_same_ids(
    monkeypatch: pytest.MonkeyPatch, partitioning: str, batch_id: int | None
) -> None:
    """A plain DataFrame's Spark partition is one bucket (producer ``J:<partition>``)
    numbered in an order of the rows only: the same rows in another order and other Arrow
    batches get the same (producer, topic partition, sequence), the reference's."""
    keys = [None if i % 7 == 0 else f"customer-{i % 13}" for i in range(400)]
    values = [f"v{i % 350}" * (i % 4 + 1) for i in range(400)]  # some rows repeat
    topics = TOPICS if batch_id is None else STREAM_TOPICS
    written = []
    for seed, size in ((1, 64), (2, 37)):
        k2, v2 = _shuffled(keys, values, seed)
        with fake_cluster(topics) as (srv, coord):
            _use_fake(monkeypatch, coord)
            task = TaskInfo(spark_partition=5, attempt=0, batch_id=batch_id, query_id="q")
            commit = ColumnarAttempt(_plain(_settings(partitioning)), task).run_columns(
                ENC, _plain_batches(k2, v2, size)
            )
            assert commit.producer_name == "J:5"
            assert commit.buckets == [5]
            assert commit.appended == commit.rows == 400
            written.append(
                Counter((tp, k, v, s) for tp, part in enumerate(_log(srv)) for k, v, s, _p in part)
            )
    assert written[0] == written[1]
    rows = [
        Row(5, 0, None if k is None else k.encode(), v.encode())
        for k, v in zip(keys, values, strict=True)
    ]
    ref = plan(rows, routing=Routing(partitioning), partitions=3, batch_id=batch_id, resume={})
    assert written[0] == Counter((r.topic_partition, r.key, r.value, r.sequence) for r in ref)


def test_a_plain_retry_in_another_order_writes_every_row_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 30 item 1 for a plain DataFrame with the same split: before, ids were
    positions in delivery order, so the retry skipped rows never written and wrote
    others again."""
    keys = [f"k{i % 5}" for i in range(300)]
    values = [f"v{i % 280}" for i in range(300)]  # 20 rows twice: both copies written
    with fake_cluster(TOPICS) as (srv, coord):
        _use_fake(monkeypatch, coord)

        def boom() -> None:
            raise InjectedFailure("injected")

        with pytest.raises(InjectedFailure):
            # row 90: in the middle of a topic partition's rows (5 keys of 60 rows each)
            ColumnarAttempt(_plain(_settings()), TaskInfo(2, 0)).run_columns(
                ENC, _plain_batches(keys, values, 50), {90: boom}
            )
        k2, v2 = _shuffled(keys, values, 4)
        commit = ColumnarAttempt(_plain(_settings()), TaskInfo(2, 1)).run_columns(
            ENC, _plain_batches(k2, v2, 33)
        )
        assert commit.skipped > 0 and commit.skipped + commit.sent == 300
        assert commit.appended == commit.sent
        got = _in_log(srv)
    assert got == Counter(v.encode() for v in values)  # every row once, copies twice


_key_values = st.one_of(
    st.none(),
    st.integers(-(2**40), 2**40),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.dates(),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
)


@settings(max_examples=150, deadline=None)
@given(
    kind=st.sampled_from(["int", "str", "bin", "date", "bool", "float"]),
    data=st.data(),
)
def test_encode_columns_gives_the_row_encoders_bytes(kind: str, data: st.DataObject) -> None:
    gen = {
        "int": st.integers(-(2**40), 2**40),
        "str": st.text(max_size=8),
        "bin": st.binary(max_size=8),
        "date": st.dates(min_value=dt.date(1, 1, 1)),
        "bool": st.booleans(),
        "float": st.floats(allow_nan=False, allow_infinity=False),
    }[kind]
    keys = data.draw(st.lists(st.one_of(st.none(), gen), max_size=20))
    vals = data.draw(
        st.lists(st.one_of(st.none(), st.text(max_size=10)), min_size=len(keys), max_size=len(keys))
    )
    batch = pa.record_batch({"id": pa.array(keys), "value": pa.array(vals, pa.string())})
    enc = RecordEncoder.for_columns([("id", "x"), ("value", "string")], "id")
    k, v = enc.encode_columns(batch)
    assert k.to_pylist() == [key_bytes(x) for x in keys]
    assert v.to_pylist() == [value_bytes(x) for x in vals]


def test_micro_batches_renew_their_producers_and_write_no_fence_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 26: each micro-batch's task took its producers over, a fence record in every
    partition per bucket and micro-batch. Now the first attempt of a micro-batch renews
    each producer at its current generation; a retry takes over (fencing the attempt
    before it), and so does a replay (ids of the micro-batch already durable: an earlier
    run may still write). Every row is written once throughout."""
    with fake_cluster(STREAM_TOPICS) as (srv, coord):
        _use_fake(monkeypatch, coord, renew=True)
        fences: list[tuple[str, int, int, int]] = []
        fence = srv.fence
        monkeypatch.setattr(srv, "fence", lambda *a: (fences.append(a), fence(*a)))

        def rows(batch_id: int) -> tuple[list[str | None], list[str]]:
            keys: list[str | None] = [f"k{i % 7}" for i in range(200)]
            return keys, [f"b{batch_id}-{i}" for i in range(200)]

        def write(batch_id: int, attempt: int = 0, **hooks: Any) -> Any:
            return ColumnarAttempt(
                _settings(), TaskInfo(0, attempt, batch_id=batch_id)
            ).run_columns(
                ENC, _batches(*rows(batch_id), 50), {int(k[1:]): v for k, v in hooks.items()}
            )

        for batch_id in range(3):
            assert write(batch_id).appended == 200
        assert fences == []  # three micro-batches (the first one created the PIDs)

        def boom() -> None:
            raise InjectedFailure("injected")

        with pytest.raises(InjectedFailure):
            write(3, r120=boom)
        assert fences == []
        retry = write(3, attempt=1)
        assert retry.skipped > 0 and retry.fenced_attempts  # its takeover fenced attempt 0
        after_retry = len(fences)
        assert after_retry == BUCKETS * 3
        assert write(4).appended == 200  # renews the retry's generation: no fence
        assert len(fences) == after_retry
        # a restart replays micro-batch 4, which is durable: a takeover, every row skipped
        replay = write(4)
        assert replay.skipped == 200 and replay.appended == 0
        assert len(fences) == after_retry + BUCKETS * 3
        got = _in_log(srv)
    assert got == Counter(v.encode() for b in range(5) for v in rows(b)[1])
