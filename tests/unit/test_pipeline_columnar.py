"""The batch write's columnar path (``pipeline.columnar``) against the row path
(``pipeline.attempt``): the same rows give the same records (keys, values, sequences,
topic partitions), the same ``PartitionCommit`` figures, the same resume after a takeover;
and ``encode_columns`` the same bytes as ``encode``."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pidlease.client.producer import AsyncProducer
from pidlease.testing.fakes import FakeCoordinator, FakePartitionServer, fake_cluster
from pipeline.attempt import Attempt, TaskInfo
from pipeline.columnar import ColumnarAttempt
from pipeline.encoding import RecordEncoder, key_bytes, value_bytes
from pipeline.errors import InjectedFailure
from pipeline.options import WriteSettings

pa = pytest.importorskip("pyarrow")

TOPICS = {"t": (3, "strict")}
STREAM_TOPICS = {"t": (3, "monotonic")}  # a stream's ids leave holes


def _use_fake(monkeypatch: pytest.MonkeyPatch, coord: FakeCoordinator) -> None:
    def _open(self: Attempt) -> AsyncProducer:
        s = self.settings
        return AsyncProducer(
            "http://fake",
            topic=s.topic,
            producer_name=self.name,
            batch_records_max=s.batch_records_max,
            http_transport=coord.transport(),
        )

    monkeypatch.setattr(Attempt, "_open", _open)


def _settings(partitioning: str = "auto") -> WriteSettings:
    return WriteSettings.parse(
        {"coordinator": "http://fake", "topic": "t", "job_name": "J", "partitioning": partitioning}
    )


def _log(srv: FakePartitionServer) -> list[list[tuple[Any, ...]]]:
    return [[(r.key, r.value, r.sequence_id, r.pid) for r in srv.records("t", p)] for p in range(3)]


ENC = RecordEncoder.for_columns([("key", "string"), ("value", "string")])


def _batches(keys: list[str | None], values: list[str], size: int) -> list[Any]:
    return [
        pa.record_batch(
            {"key": pa.array(keys[i : i + size], pa.string()), "value": values[i : i + size]}
        )
        for i in range(0, len(keys), size)
    ]


@pytest.mark.parametrize("batch_id", [None, 7], ids=["batch", "micro-batch"])
@pytest.mark.parametrize("partitioning", ["auto", "spark"])
def test_columnar_and_row_paths_write_the_same(
    monkeypatch: pytest.MonkeyPatch, partitioning: str, batch_id: int | None
) -> None:
    keys = [None if i % 7 == 0 else f"customer-{i % 13}" for i in range(500)]
    values = [f"v{i}" * (i % 5) for i in range(500)]
    results = []
    for columnar in (False, True):
        with fake_cluster(TOPICS if batch_id is None else STREAM_TOPICS) as (srv, coord):
            _use_fake(monkeypatch, coord)
            task = TaskInfo(spark_partition=4, attempt=0, batch_id=batch_id, query_id="q")
            batches = _batches(keys, values, 64)
            if columnar:
                commit = ColumnarAttempt(_settings(partitioning), task).run_columns(ENC, batches)
            else:
                rows = [pair for b in batches for pair in ENC.encode(b)]
                commit = Attempt(_settings(partitioning), task).run(rows)
            results.append((_log(srv), commit.figures()))
    assert results[0] == results[1]
    assert results[1][1]["appended"] == 500
    if batch_id is not None:  # ids from batch_id * 2**32, consecutive per topic partition
        for part in results[1][0]:
            seqs = [s for _k, _v, s, _p in part]
            assert seqs == list(range(batch_id << 32, (batch_id << 32) + len(seqs)))


def test_a_replayed_micro_batch_resumes_after_what_is_durable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = [f"k{i % 5}" for i in range(300)]
    values = [f"v{i}" for i in range(300)]
    with fake_cluster(STREAM_TOPICS) as (srv, coord):
        _use_fake(monkeypatch, coord)
        # micro-batch 2 of the query, after micro-batch 1 was written whole
        ColumnarAttempt(_settings(), TaskInfo(0, 0, batch_id=1, query_id="q")).run_columns(
            ENC, _batches(keys, values, 50)
        )

        def boom() -> None:
            raise InjectedFailure("injected")

        with pytest.raises(InjectedFailure):
            ColumnarAttempt(_settings(), TaskInfo(0, 0, batch_id=2, query_id="q")).run_columns(
                ENC, _batches(keys, values, 50), {120: boom}
            )
        # the replay (after a restart from the checkpoint): attempt 0 again, same rows
        commit = ColumnarAttempt(_settings(), TaskInfo(0, 0, batch_id=2, query_id="q")).run_columns(
            ENC, _batches(keys, values, 50)
        )
        assert commit.rows == 300
        assert 0 < commit.skipped < 300  # rows before the kill were durable
        assert commit.appended == commit.sent == 300 - commit.skipped
        got = sorted(v for part in _log(srv) for _k, v, _s, _p in part)
    assert got == sorted(v.encode() for v in values * 2)  # every row of both batches once


def test_a_retry_resumes_after_what_is_durable(monkeypatch: pytest.MonkeyPatch) -> None:
    keys = [f"k{i % 5}" for i in range(300)]
    values = [f"v{i}" for i in range(300)]
    with fake_cluster(TOPICS) as (srv, coord):
        _use_fake(monkeypatch, coord)

        def boom() -> None:
            raise InjectedFailure("injected")

        with pytest.raises(InjectedFailure):
            ColumnarAttempt(_settings(), TaskInfo(0, 0)).run_columns(
                ENC, _batches(keys, values, 50), {120: boom}
            )
        commit = ColumnarAttempt(_settings(), TaskInfo(0, 1)).run_columns(
            ENC, _batches(keys, values, 50)
        )
        assert commit.rows == 300
        assert commit.skipped + commit.sent == 300
        assert commit.skipped > 0  # rows before the failure were durable: not sent again
        assert commit.appended == commit.sent
        got = sorted(v for part in _log(srv) for _k, v, _s, _p in part)
    assert got == sorted(v.encode() for v in values)  # every row once


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
