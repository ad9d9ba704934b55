"""Option parsing of the data source, and the fault hooks they turn on."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from pidlease.client.lease_client import DEFAULT_COORDINATOR
from pidlease.spark.errors import InjectedFailure, OptionError
from pidlease.spark.options import Faults, ReadSettings, WriteSettings
from pidlease.spark.sequencing import Routing

pytest.importorskip("pyspark")
from pidlease.spark.attempt import TaskInfo
from pidlease.spark.faults import hooks_for, wants_twin


def test_write_settings_with_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIDLEASE_COORDINATOR", raising=False)
    s = WriteSettings.parse({"topic": "orders", "job_name": "nightly"})
    assert (s.coordinator, s.topic, s.job_name, s.routing) == (
        DEFAULT_COORDINATOR,
        "orders",
        "nightly",
        Routing.AUTO,
    )
    assert s.key_column is None and s.report_path is None and s.faults == Faults()


def test_options_are_case_insensitive_and_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIDLEASE_COORDINATOR", "http://127.0.0.1:1")
    s = WriteSettings.parse(
        {
            "Topic": "t",
            "JOB_NAME": "j",
            "key_column": "c",
            "partitioning": "SPARK",
            "linger_ms": "0",
            "max_in_flight": "9",
            "fail_after_rows_once": "10",
            "fail_partitions": "1, 3",
        }
    )
    assert s.coordinator == "http://127.0.0.1:1"
    assert (s.key_column, s.routing, s.linger_ms, s.max_in_flight) == ("c", Routing.SPARK, 0, 9)
    assert s.faults.fail_after_rows_once == 10 and s.faults.fail_partitions == frozenset({1, 3})


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"job_name": "j"}, "topic is required"),
        ({"topic": "t"}, "job_name is required"),
        ({"topic": "t", "job_name": "j", "max_in_flight": "0"}, "max_in_flight"),
        ({"topic": "t", "job_name": "j", "linger_ms": "soon"}, "must be an integer"),
        ({"topic": "t", "job_name": "j", "partitioning": "random"}, "auto, spark or key"),
        ({"topic": "t", "job_name": "j", "fail_partitions": "a,b"}, "comma-separated"),
    ],
)
def test_bad_write_options_say_which(options: dict, match: str) -> None:
    with pytest.raises(OptionError, match=match):
        WriteSettings.parse(options)


def test_a_stream_may_leave_the_job_name_to_the_query_id() -> None:
    assert WriteSettings.parse({"topic": "t"}, streaming=True).job_name is None


def test_read_settings() -> None:
    s = ReadSettings.parse(
        {"topic": "t", "coordinator": "http://127.0.0.1:2", "split_records": "10"}
    )
    assert (s.coordinator, s.topic, s.split_records) == ("http://127.0.0.1:2", "t", 10)
    with pytest.raises(OptionError):
        ReadSettings.parse({"topic": "t", "split_records": "0"})


def test_fail_after_rows_once_hits_attempt_zero_of_chosen_partitions_only() -> None:
    f = Faults(fail_after_rows_once=5, fail_partitions=frozenset({1}))
    assert hooks_for(f, TaskInfo(0, 0)) == {}
    assert hooks_for(f, TaskInfo(1, 1)) == {}
    assert hooks_for(f, TaskInfo(1, 0, batch_id=3)) == {}  # batch writes only
    hooks = hooks_for(f, TaskInfo(1, 0))
    with pytest.raises(InjectedFailure, match="after 5 rows"):
        hooks[5]()


def test_kill_batch_hits_every_attempt_of_that_batch() -> None:
    f = Faults(kill_batch_id=2, kill_at_row=7)
    assert hooks_for(f, TaskInfo(0, 0, batch_id=1)) == {}
    for attempt in range(3):
        with pytest.raises(InjectedFailure, match="micro-batch 2"):
            hooks_for(f, TaskInfo(0, attempt, batch_id=2))[7]()


def test_speculative_copy_only_for_attempt_zero_of_its_partition() -> None:
    f = Faults(speculate_partition=2)
    assert wants_twin(f, TaskInfo(2, 0))
    assert not wants_twin(f, TaskInfo(2, 1))
    assert not wants_twin(f, TaskInfo(1, 0))
    assert not wants_twin(f, TaskInfo(2, 0, speculative=True))


def test_a_stall_hits_attempt_zero_of_its_partition_and_leaves_a_marker(tmp_path: Path) -> None:
    marker = tmp_path / "stalled"
    f = Faults.parse(
        {"stall_partition": "1", "stall_at_row": "5", "stall_ms": "10", "stall_marker": str(marker)}
    )
    assert (f.stall_partition, f.stall_at_row, f.stall_s) == (1, 5, 0.01)
    assert not hooks_for(f, TaskInfo(1, 1)) and not hooks_for(f, TaskInfo(0, 0))
    assert not hooks_for(f, TaskInfo(1, 0, batch_id=3))
    asyncio.run(hooks_for(f, TaskInfo(1, 0))[5]())  # a stall is awaited by the attempt
    assert marker.read_text() == f"{os.getpid()} 1\n"
