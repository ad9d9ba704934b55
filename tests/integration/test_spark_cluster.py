"""The pipeline on a real Spark standalone cluster: a master and two workers started from
the installed PySpark's ``spark-class`` (one worker on 127.0.0.1, one on 127.0.0.2, so
Spark has a second host to run a speculative copy on), one core each, ``--work-dir`` in a
tmp dir, executors running this checkout's pidlease (``spark.executorEnv.PYTHONPATH``)
with ``PYSPARK_PYTHON`` = this interpreter.

In file order (the first test runs its own Spark application, so it comes before the
module's session holds the cluster's cores):
1. ``pidlease-spark publish --master spark://...`` as a user runs it: a batch write,
   its report line printed once;
2. an executor SIGKILLed mid-write (a task stalled after its first rows), then the audit;
3. a real speculative copy (Spark's own speculation of a stalled task), then the audit;
4. a keyed streaming query killed mid-batch and restarted from its checkpoint, audited.
Each audit: 0 duplicates, 0 missing; the job reports' attempt figures are checked.
And, with no cluster: a bad ``PYSPARK_PYTHON`` makes the command name the real cause.

Marked slow (a few minutes on 2 loaded cores); ``scripts/test.sh`` runs slow tests too.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pyspark = pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

import pidlease.spark  # noqa: E402 - after the importorskip calls, on purpose
from pidlease.spark import job_report  # noqa: E402 - as above
from pidlease.spark.audit import run_audit  # noqa: E402 - as above
from pidlease.spark.progress import task_attempts  # noqa: E402 - as above
from pidlease.spark.session import build_session  # noqa: E402 - as above
from pidlease.spark.testing import (  # noqa: E402 - as above
    HOSTS,
    REPO,
    START_TIMEOUT_S,
    Standalone,
    executor_env,
    wait_for_executors,
)

pytestmark = pytest.mark.slow

JOB_TIMEOUT_S = 600.0
ROWS = 40_000
PARTITIONS = 4
PER_TASK = ROWS // PARTITIONS  # about: each task holds two buckets of the rows
BUCKETS = 2 * PARTITIONS
PUBLISHED: dict[str, int] = {}  # topic -> records the publish command wrote, audited later


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    cluster = Standalone(tmp_path_factory.mktemp("spark-standalone")).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def pidlease_cluster(make_module_cluster: Any) -> Any:
    return make_module_cluster(servers=2)


CLUSTER_CONF = {
    "spark.executor.memory": "768m",
    "spark.executor.cores": "1",
    "spark.cores.max": "2",
    "spark.executorEnv.PYTHONPATH": str(REPO),
    "spark.sql.shuffle.partitions": "4",
    "spark.task.maxFailures": "4",
}


@pytest.fixture(scope="module")
def spark(standalone: Standalone) -> Iterator[Any]:
    # Speculation as a user would turn it on, made keener than the defaults so that a task
    # stalled for a minute is copied within seconds, and calm enough that tasks of a few
    # seconds on loaded cores are not.
    conf = {
        **CLUSTER_CONF,
        "spark.speculation": "true",
        "spark.speculation.interval": "200ms",
        "spark.speculation.quantile": "0.5",
        "spark.speculation.multiplier": "3",
        "spark.speculation.minTaskRuntime": "10s",
    }
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the only way to name the interpreter
    session = build_session(standalone.url, app_name="pidlease-cluster-tests", conf=conf)
    wait_for_executors(session, HOSTS)
    yield session
    session.stop()


def _data(spark: Any) -> Any:
    return spark.range(ROWS, numPartitions=PARTITIONS).selectExpr(
        "concat('customer-', CAST(id % 997 AS STRING)) AS key",
        "to_json(named_struct('id', id)) AS value",
    )


def _write(df: Any, url: str, topic: str, job: str, report: Path, **options: Any) -> None:
    w = (
        pidlease.spark.bucketed(df, BUCKETS, PARTITIONS)
        .write.format("pidlease")
        .option("coordinator", url)
        .option("topic", topic)
        .option("job_name", job)
        .option("report_path", str(report))
        .option("expire_ms", "600000")
    )
    for k, v in options.items():
        w = w.option(k, str(v))
    w.mode("append").save()


def _ids(spark: Any, url: str, topic: str) -> tuple[int, int, int, int]:
    from pyspark.sql import functions as F

    df = spark.read.format("pidlease").option("coordinator", url).option("topic", topic).load()
    ids = df.select(
        F.get_json_object(F.col("value").cast("string"), "$.id").cast("long").alias("i")
    )
    row = ids.agg(F.count("i"), F.countDistinct("i"), F.min("i"), F.max("i")).first()
    return (int(row[0]), int(row[1]), int(row[2]), int(row[3]))


def _audit_ok(spark: Any, url: str, topic: str, records: int) -> dict[str, Any]:
    audit = run_audit(spark, url, topic)
    assert (audit["records"], audit["duplicates"], audit["missing"], audit["ok"]) == (
        records,
        0,
        0,
        True,
    )
    assert _ids(spark, url, topic) == (records, records, 0, records - 1)
    return audit


def _python_env(**extra: str) -> dict[str, str]:
    env = executor_env()
    env.update(extra)
    return env


def test_a_bad_pyspark_python_is_named_as_the_cause(tmp_path: Path) -> None:
    data = tmp_path / "in"
    data.mkdir()
    (data / "a.json").write_text('{"id": 1}\n')
    bad = str(tmp_path / "no-such-python3")
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pidlease.spark.cli", "publish", "--input", str(data)),
            *("--format", "json", "--topic", "t", "--master", "local[1]"),
            *("--coordinator", "http://127.0.0.1:9"),
        ],
        check=False,
        env=_python_env(PYSPARK_PYTHON=bad),
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("pidlease-spark publish: IOException: Cannot run program"), last
    assert bad in last and "Py4J" not in last


def test_publish_command_on_the_cluster_prints_its_report_once(
    standalone: Standalone, pidlease_cluster: Any, tmp_path: Path
) -> None:
    url = pidlease_cluster.coordinator_url
    pidlease_cluster.create_topic("orders", partitions=4)
    data = tmp_path / "orders"
    data.mkdir()
    for f in range(2):
        with open(data / f"orders-{f}.json", "w") as out:
            out.writelines(
                json.dumps({"id": i, "customer": f"c{i % 13}"}) + "\n"
                for i in range(f * 3000, (f + 1) * 3000)
            )
    report = tmp_path / "report.json"
    conf = [f"--conf={k}={v}" for k, v in CLUSTER_CONF.items()]
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pidlease.spark.cli", "publish", "--input", str(data)),
            *("--format", "json", "--topic", "orders", "--key-column", "customer"),
            *("--coordinator", url, "--master", standalone.url, "--report", str(report)),
            *conf,
        ],
        check=False,
        env=_python_env(),
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-5000:] + standalone.logs()
    assert out.count("pidlease write to 'orders'") == 1, out[-5000:]
    assert "6000 rows, 6000 appended, 0 skipped" in done.stdout
    [r] = job_report.load(report)
    assert (r["committed"], r["rows"], r["failed_tasks"], r["fenced_attempts"]) == (
        True,
        6000,
        0,
        0,
    )
    assert r["spark_attempts"]["launched"] == r["tasks"] >= 1
    # one producer per bucket (the default 32), named in the partition entries
    named = {n for p in r["partitions"] for n in p["producer_name"].split(",")}
    assert named == set(r["producers"]) and len(named) == 32
    PUBLISHED["orders"] = 6000


def test_an_executor_killed_mid_write_loses_and_doubles_nothing(
    spark: Any, standalone: Standalone, pidlease_cluster: Any, tmp_path: Path
) -> None:
    url = pidlease_cluster.coordinator_url
    for topic, records in PUBLISHED.items():  # the command's write, audited on the cluster
        _audit_ok(spark, url, topic, records)
    pidlease_cluster.create_topic("killed", partitions=4)
    marker, report = tmp_path / "stalled", tmp_path / "job.json"
    stall_at = PER_TASK // 2
    killed: list[str] = []

    def kill_when_stalled() -> None:
        # The save() runs on the test's thread (the data source is registered with the
        # session there); this one SIGKILLs the executor of the stalled task.
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        if not marker.exists():
            return
        worker_pid = int(marker.read_text().split()[0])
        executor = _executor_of(worker_pid)
        time.sleep(2)  # what the stalled attempt sent becomes durable: mid-write, not row 0
        os.kill(executor, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):  # its Python worker dies with it
            os.kill(worker_pid, signal.SIGKILL)
        killed.append(f"executor {executor}, Python worker {worker_pid}")

    killer = threading.Thread(target=kill_when_stalled, daemon=True)
    killer.start()
    _write(
        _data(spark),
        url,
        "killed",
        "killed-job",
        report,
        stall_partition=1,
        stall_at_row=stall_at,
        stall_ms=int(JOB_TIMEOUT_S * 1000),  # until it is killed
        stall_marker=marker,
    )
    killer.join(10)
    assert killed, "the stalled task's executor was never killed"
    [r] = job_report.load(report)
    assert r["committed"] and r["rows"] == ROWS and r["failed_tasks"] == 0
    assert r["appended"] + r["skipped"] + r["duplicates"] == ROWS
    task = {p["spark_partition"]: p for p in r["partitions"]}[1]
    # The retry took the producers over and skipped what the killed attempt made durable.
    # The lost executor held shuffle output (the shuffle by bucket), so Spark may resubmit
    # the write stage, whose task is attempt 0 again: then no earlier attempt is
    # recorded (an executor cannot tell a resubmitted stage's attempt 0 from a first).
    assert 0 < task["skipped"] <= stall_at
    if task["attempt"] >= 1:
        [fenced] = task["fenced_attempts"]
        assert fenced["durable_rows"] == task["skipped"]
    _audit_ok(spark, url, "killed", ROWS)


def _executor_of(pid: int) -> int:
    """The executor JVM above a Python worker process (worker <- daemon <- executor)."""
    seen = []
    while pid > 1 and len(seen) < 10:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"CoarseGrainedExecutorBackend" in cmdline:
            return pid
        seen.append(pid)
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    raise AssertionError(f"no executor JVM above processes {seen}")


def test_a_real_speculative_copy_fences_the_straggler(
    spark: Any, pidlease_cluster: Any, tmp_path: Path
) -> None:
    url = pidlease_cluster.coordinator_url
    wait_for_executors(spark, HOSTS)  # the killed executor's replacement, for the copy
    pidlease_cluster.create_topic("speculated", partitions=4)
    report = tmp_path / "job.json"
    stall_at = PER_TASK // 2
    group = "pidlease-speculation-test"
    spark.sparkContext.setJobGroup(group, "speculation")
    try:
        _write(
            _data(spark),
            url,
            "speculated",
            "speculated-job",
            report,
            stall_partition=2,
            stall_at_row=stall_at,
            stall_ms=240_000,  # a straggler: Spark copies it long before it wakes
        )
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    [r] = job_report.load(report)
    attempts = task_attempts(spark, group)
    job_report.with_spark_attempts(r, attempts)

    assert r["committed"] and r["rows"] == ROWS and r["failed_tasks"] == 0
    copy = {p["spark_partition"]: p for p in r["partitions"]}[2]
    # Spark's own speculative copy won; its takeover fenced the straggler, which it
    # recorded; it skipped what the straggler had made durable.
    assert copy["speculative"] and copy["attempt"] >= 1, attempts
    assert r["speculative_tasks"] >= 1 and r["spark_attempts"]["speculative"] >= 1
    assert 0 < copy["skipped"] <= stall_at
    assert copy["appended"] + copy["skipped"] + copy["duplicates"] == copy["rows"]
    [fenced] = copy["fenced_attempts"]
    assert (fenced["pid"], fenced["generation"]) == (copy["pid"], copy["generation"] - 1)
    assert r["retried_tasks"] == sum(
        1 for p in r["partitions"] if p["attempt"] > 0 and not p["speculative"]
    )
    # Spark kills the straggler once the copy won (asynchronously, so wait for it).
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        attempts = task_attempts(spark, group)
        original = [a for a in attempts if a["index"] == 2 and not a["speculative"]]
        if original and original[0]["status"] != "RUNNING":
            break
        time.sleep(1)
    assert original and original[0]["status"] in ("KILLED", "FAILED"), attempts
    assert len({a["host"] for a in attempts if a["index"] == 2}) == 2  # two hosts
    _audit_ok(spark, url, "speculated", ROWS)


def test_a_keyed_stream_restarts_from_its_checkpoint_exactly_once(
    spark: Any, pidlease_cluster: Any, tmp_path: Path
) -> None:
    url = pidlease_cluster.coordinator_url
    pidlease_cluster.create_topic("events", partitions=4, dedup="monotonic")
    src, ck, reports = tmp_path / "in", tmp_path / "ck", tmp_path / "stream.jsonl"
    src.mkdir()
    files, per_file = 3, 4000
    for f in range(files):
        with open(src / f"events-{f}.json", "w") as out:
            out.writelines(
                json.dumps({"id": i, "key": f"c{i % 101}"}) + "\n"
                for i in range(f * per_file, (f + 1) * per_file)
            )

    def run(**faults: int) -> Any:
        stream = (
            spark.readStream.schema("id LONG, key STRING")
            .option("maxFilesPerTrigger", 1)
            .json(str(src))
            .selectExpr("key", "to_json(named_struct('id', id)) AS value")
        )
        w = (
            pidlease.spark.bucketed(stream, BUCKETS, PARTITIONS)
            .writeStream.format("pidlease")
            .option("coordinator", url)
            .option("topic", "events")
            .option("checkpointLocation", str(ck))
            .option("report_path", str(reports))
        )
        for k, v in faults.items():
            w = w.option(k, str(v))
        q = w.trigger(availableNow=True).start()
        with contextlib.suppress(Exception):  # the injected kill: q.exception() says
            q.awaitTermination(JOB_TIMEOUT_S)
        assert not q.isActive
        return q.exception()

    # Run 1: micro-batch 1 dies at row 500 of each task (about 1000 rows) on every
    # attempt, with rows of it durable.
    assert run(kill_batch_id=1, kill_at_row=500) is not None
    # Run 2: the restart replays batch 1 with the same ids, then batch 2.
    assert run() is None

    committed = [r for r in job_report.load(reports) if r["committed"]]
    assert [r["batch_id"] for r in committed] == [0, 1, 2]
    replayed = committed[1]
    assert replayed["skipped"] + replayed["duplicates"] > 0  # what the killed run wrote
    assert replayed["appended"] + replayed["skipped"] + replayed["duplicates"] == per_file
    audit = _audit_ok(spark, url, "events", files * per_file)
    # Ids jump only between micro-batches: within one, each topic partition's are
    # consecutive (whole SDK batches), so a PID has at most one hole per batch boundary.
    assert audit["gaps_allowed"] and 0 < audit["allowed_gaps"] <= 4 * (files - 1) * audit["pids"]
