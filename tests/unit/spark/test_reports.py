"""The job report (commit messages added up), the audit report (from aggregates), the
read planning and the command line's parser: the parts of the pipeline without Spark jobs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

# pidlease.spark.attempt and .scan import pyspark at module level: these imports follow the
# importorskip calls so a machine without Spark skips this file instead of failing to collect it.
from pidlease.spark import job_report  # noqa: E402 - after the importorskip calls, on purpose
from pidlease.spark.attempt import PartitionCommit, TaskInfo, takeover_record  # noqa: E402 - as above
from pidlease.spark.audit import build_report, summary, write_report  # noqa: E402 - as above
from pidlease.spark.cli import cause, default_job_name, parser  # noqa: E402 - as above
from pidlease.spark.scan import OffsetRange, plan_ranges  # noqa: E402 - as above


def _commit(k: int, attempt: int = 0, **kw: int) -> PartitionCommit:
    c = PartitionCommit(k, attempt, f"j:{k}", pid=10 + k, generation=1)
    for name, v in kw.items():
        setattr(c, name, v)
    return c


def test_job_report_adds_up_tasks_and_counts_failed_ones(tmp_path: Path) -> None:
    twin = _commit(1, 1, rows=10, skipped=4, sent=6, appended=6)
    twin.speculative = True
    twin.fenced_attempts.append({"sent": 5})
    msgs = [_commit(0, 1, rows=10, skipped=5, sent=5, appended=4, duplicates=1), twin, None]
    r = job_report.summarize(msgs, topic="t", committed=False)
    assert (r["rows"], r["skipped"], r["sent"], r["appended"], r["duplicates"]) == (
        20,
        9,
        11,
        10,
        1,
    )
    assert (r["tasks"], r["failed_tasks"], r["retried_tasks"], r["fenced_attempts"]) == (3, 1, 1, 1)
    assert r["speculative_tasks"] == 1
    assert r["producers"] == ["j:0", "j:1"]
    assert "ABORTED" in job_report.one_line(r)
    path = tmp_path / "r" / "report.json"
    job_report.save(r, str(path))
    assert job_report.load(path) == [r]
    lines = tmp_path / "stream.jsonl"
    for b in range(2):
        job_report.save(
            job_report.summarize(msgs[:1], topic="t", committed=True, batch_id=b),
            str(lines),
            append=True,
        )
    assert [x["batch_id"] for x in job_report.load(lines)] == [0, 1]


def _group(partition: int, pid: int, records: int, distinct: int, first: int, last: int) -> dict:
    return {
        "partition": partition,
        "pid": pid,
        "records": records,
        "distinct_sequences": distinct,
        "first_sequence": first,
        "last_sequence": last,
        "first_offset": 0,
        "last_offset": records - 1,
        "first_timestamp_ms": 1,
        "last_timestamp_ms": 2,
    }


PIDS = [
    {
        "pid": 5,
        "producer_name": "j:0",
        "generation": 3,
        "state": "active",
        "last_use_ms": 900,
        "expires_at_ms": 61_000,
    }
]


def test_audit_counts_duplicates_and_gaps_per_pid_and_partition() -> None:
    groups = [
        _group(0, 5, 100, 100, 0, 99),
        _group(1, 5, 12, 10, 0, 9),
        _group(1, 6, 8, 8, 0, 9),
        _group(0, 0, 4, 1, -1, -1),
    ]
    r = build_report(
        topic="t",
        dedup="strict",
        partitions=3,
        groups=groups,
        duplicate_examples=[],
        pids=PIDS,
        now_ms=1000,
    )
    assert (r["records"], r["unchecked_records"], r["duplicates"], r["missing"]) == (124, 4, 2, 2)
    assert (r["allowed_gaps"], r["skipped_ids"]) == (0, 0)  # strict: a hole is a missing record
    assert [p["records"] for p in r["partitions"]] == [104, 20, 0]
    assert [(p["duplicates"], p["missing"]) for p in r["partitions"]] == [(0, 0), (2, 2), (0, 0)]
    assert not r["ok"]
    five, six = r["pid_usage"]
    assert (five["producer_name"], five["records"], five["time_to_expiry_ms"]) == (
        "j:0",
        112,
        60_000,
    )
    assert [p["partition"] for p in five["partitions"]] == [0, 1]
    assert six["state"] == "unknown" and six["time_to_expiry_ms"] is None
    assert "VIOLATED" in summary(r)


def test_gaps_are_allowed_on_monotonic_topics_but_duplicates_are_not() -> None:
    # Six micro-batches of a stream: ids b * 2**32 + 0..9, five jumps between them.
    stream = {**_group(0, 5, 60, 60, 0, (5 << 32) + 9), "holes": 5}
    r = build_report(
        topic="t",
        dedup="monotonic",
        partitions=1,
        groups=[stream],
        duplicate_examples=[],
        pids=PIDS,
        now_ms=0,
    )
    assert r["ok"] and r["missing"] == 0
    assert (r["allowed_gaps"], r["skipped_ids"]) == (5, (5 << 32) + 10 - 60)
    assert r["partitions"][0]["allowed_gaps"] == 5 and r["producers"][0]["missing"] == 0
    text = summary(r)
    assert "0 missing, 5 allowed gaps (monotonic ids, 21,474,836,430 ids skipped)" in text
    assert "OK" in text and " gaps," not in text.replace("allowed gaps", "")
    dup = [_group(0, 5, 3, 2, 0, 1)]
    assert not build_report(
        topic="t",
        dedup="monotonic",
        partitions=1,
        groups=dup,
        duplicate_examples=[],
        pids=PIDS,
        now_ms=0,
    )["ok"]


def test_a_strict_topic_reports_holes_as_missing_records() -> None:
    r = build_report(
        topic="t",
        dedup="strict",
        partitions=1,
        groups=[{**_group(0, 5, 8, 8, 0, 9), "holes": 1}],
        duplicate_examples=[],
        pids=PIDS,
        now_ms=0,
    )
    assert not r["ok"] and (r["missing"], r["allowed_gaps"]) == (2, 0)
    assert "VIOLATED - 0 duplicates, 2 missing" in summary(r)


def test_audit_report_files_round_trip(tmp_path: Path) -> None:
    r = build_report(
        topic="t",
        dedup="strict",
        partitions=2,
        groups=[_group(1, 5, 3, 2, 0, 1)],
        duplicate_examples=[
            {
                "partition": 1,
                "pid": 5,
                "sequence_id": 1,
                "copies": 2,
                "first_offset": 1,
                "last_offset": 2,
            }
        ],
        pids=PIDS,
        now_ms=1000,
    )
    files = write_report(r, tmp_path / "out")
    assert sorted(f.name for f in files) == [
        "duplicates.parquet",
        "partitions.parquet",
        "producers.parquet",
        "report.json",
    ]
    assert json.loads((tmp_path / "out" / "report.json").read_text())["duplicates"] == 1
    producers = pq.read_table(tmp_path / "out" / "producers.parquet").to_pylist()
    assert producers[0]["producer_name"] == "j:0" and producers[0]["duplicates"] == 1
    assert pq.read_table(tmp_path / "out" / "partitions.parquet").num_rows == 2


def test_read_ranges_split_large_partitions() -> None:
    assert plan_ranges([5, 0, 12], 5) == [
        OffsetRange(0, 0, 5),
        OffsetRange(2, 0, 5),
        OffsetRange(2, 5, 10),
        OffsetRange(2, 10, 12),
    ]
    assert plan_ranges([-1], 5) == [OffsetRange(0, 0, -1)]
    assert plan_ranges([0, 0], 5) == [OffsetRange(0, 0, 0)]


def test_cli_help_and_default_job_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        parser().parse_args(["--help"])
    assert e.value.code == 0
    assert "exactly once" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        parser().parse_args(["publish", "--topic", "t"])
    assert e.value.code == 2
    a = default_job_name("t", "data/in", "parquet")
    assert a == default_job_name("t", "data/in", "parquet")
    assert (
        a
        != default_job_name("t", "data/other", "parquet")
        != default_job_name("t", "data/in", "csv")
    )
    args = parser().parse_args(["audit", "--topic", "t", "--out", "d"])
    assert (args.master, args.topic, args.out) == ("local[*]", "t", "d")


def test_a_retry_or_copy_records_the_attempt_its_takeover_fenced() -> None:
    # Attempt 0 made rows durable in topic partitions 0 and 2; attempt 1 took over (the
    # generation went 7 -> 8): it records generation 7 as fenced, since the fenced
    # attempt's task fails and sends no commit message of its own.
    retry = TaskInfo(3, 1)
    assert takeover_record(retry, 42, 8, {0: 9, 1: -1, 2: 4}) == {
        "pid": 42,
        "generation": 7,
        "fenced_by_attempt": 1,
        "durable_rows": 15,
    }
    assert takeover_record(TaskInfo(3, 0), 42, 8, {0: 9}) is None  # a first attempt
    assert takeover_record(retry, 42, 8, {0: -1}) is None  # nothing durable: no trace
    # A stream counts only this micro-batch's ids: batch 4's ids say nothing of batch 5.
    stream = TaskInfo(0, 1, batch_id=5)
    assert takeover_record(stream, 42, 8, {0: (4 << 32) + 99}) is None
    assert takeover_record(stream, 42, 8, {0: (5 << 32) + 2, 1: 4 << 32}) == {
        "pid": 42,
        "generation": 7,
        "fenced_by_attempt": 1,
        "durable_rows": 3,
    }


def test_the_driver_tells_speculative_copies_from_retries(tmp_path: Path) -> None:
    # What Spark saw: task 0 retried after a failure; task 1's speculative copy won, its
    # original failed (fenced); task 2 ran once. Executors report attempt > 0 for both.
    copy = _commit(1, 1, rows=10, appended=6, skipped=4, sent=6)
    copy.fenced_attempts.append({"pid": 11, "generation": 0, "fenced_by_attempt": 1})
    retry = _commit(0, 1, rows=10, appended=5, skipped=5, sent=5)
    retry.fenced_attempts.append({"pid": 10, "generation": 0, "fenced_by_attempt": 1})
    r = job_report.summarize([retry, copy, _commit(2, rows=10)], topic="t", committed=True)
    assert (r["retried_tasks"], r["speculative_tasks"], r["fenced_attempts"]) == (2, 0, 2)
    attempts = [
        {"index": 0, "attempt": 0, "speculative": False, "status": "FAILED"},
        {"index": 0, "attempt": 1, "speculative": False, "status": "SUCCESS"},
        {"index": 1, "attempt": 0, "speculative": False, "status": "FAILED"},
        {"index": 1, "attempt": 1, "speculative": True, "status": "SUCCESS"},
        {"index": 2, "attempt": 0, "speculative": False, "status": "SUCCESS"},
    ]
    job_report.with_spark_attempts(r, attempts)
    assert (r["retried_tasks"], r["speculative_tasks"], r["fenced_attempts"]) == (1, 1, 2)
    assert [p["speculative"] for p in r["partitions"]] == [False, True, False]
    assert r["spark_attempts"] == {"launched": 5, "speculative": 1, "failed": 2, "killed": 0}
    line = job_report.one_line(r)
    assert "(0 failed, 1 retried, 1 speculative, 2 earlier attempts fenced)" in line


def test_save_logs_the_report_line_unless_quiet(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    r = job_report.summarize([_commit(0, rows=3)], topic="t", committed=True)
    with caplog.at_level("WARNING", logger="pidlease.spark.job_report"):
        job_report.save(r, str(tmp_path / "a.json"))
        job_report.save(r, str(tmp_path / "b.json"), quiet=True)
    assert [rec.getMessage() for rec in caplog.records] == [job_report.one_line(r)]
    assert job_report.load(tmp_path / "b.json") == [r]


class _Throwable:
    """A stand-in for a py4j JavaObject of a java.lang.Throwable."""

    def __init__(self, text: str, cause: _Throwable | None = None) -> None:
        self.text, self.cause = text, cause

    def toString(self) -> str:  # noqa: N802 - Java's name
        return self.text

    def getCause(self) -> _Throwable | None:  # noqa: N802 - Java's name
        return self.cause

    def equals(self, other: object) -> bool:
        return other is self


class _Py4JJavaError(Exception):
    def __init__(self, java_exception: _Throwable) -> None:
        super().__init__("An error occurred while calling o58.save.\n")
        self.java_exception = java_exception


def test_cause_names_the_innermost_java_or_python_error() -> None:
    bad_python = _Py4JJavaError(
        _Throwable(
            'java.io.IOException: Cannot run program "/no/python3": error=2, No such file',
            _Throwable("java.io.IOException: error=2, No such file"),
        )
    )
    assert (
        cause(bad_python) == 'IOException: Cannot run program "/no/python3": error=2, No such file'
    )
    traceback = (
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "worker.py", line 1, in main\n'
        "ModuleNotFoundError: No module named 'pidlease'\n"
    )
    no_module = _Py4JJavaError(
        _Throwable(
            "org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 failed",
            _Throwable(traceback),
        )
    )
    assert cause(no_module) == "ModuleNotFoundError: No module named 'pidlease'"
    ours = RuntimeError(
        "Job aborted\npidlease.spark.errors.AttemptFenced: attempt 0 was fenced\nValueError: later"
    )
    assert cause(ours) == "AttemptFenced: attempt 0 was fenced"
