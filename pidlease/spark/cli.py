"""``pidlease-spark``: publish a data set to a topic exactly once, and audit a topic.

Both commands run a Spark session of their own (``pidlease.spark.session``; ``--master
local[*]`` by default), print progress lines while Spark works (``pidlease.spark.progress``)
and a summary at the end. ``publish`` exits 0 when the job committed; ``audit`` exits 0
when the topic is exactly-once and 1 when it is not, like ``pidlease verify``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pidlease.client.lease_client import DEFAULT_COORDINATOR
from pidlease.spark.options import COORDINATOR_ENV
from pidlease.spark.sequencing import BUCKETS_DEFAULT

MIN_PARTITIONS_DEFAULT = 8
PARTITIONS_DEFAULT = 8

DESCRIPTION = """\
Publish data sets to pidlease exactly once with Spark, and audit topics.

publish reads files (parquet, csv or json) and writes every row to the topic exactly
once: rows are grouped by a hash of the row into --buckets buckets, each published by
the named producer <job-name>:<bucket>/<buckets>, and numbered in an order that depends
on the rows only, so a retried or speculative task takes the names over (fencing the old
attempt) and resumes after the last durable row, and a re-run over the same rows (files
listed or split differently, another --master) appends nothing. The job name defaults to
one derived from the topic, the input path and the format, so re-running the same
command is safe; give --job-name to publish the same files again as a new data set.

audit reads the whole topic and writes a report (report.json and Parquet tables) of
records per partition, duplicates per (pid, partition, sequence), missing records (and a
monotonic topic's allowed gaps, apart), and per
PID its first/last offsets, last use and time to expiry.
"""

EPILOG = """\
examples:
  pidlease-spark publish --input orders/ --format parquet --topic orders --key-column customer
  pidlease-spark audit --topic orders --out /tmp/orders-audit
  pidlease-spark publish ... --master 'local[4,3]'     # 4 cores, a failed task retried twice
"""


def default_job_name(topic: str, input_path: str, fmt: str) -> str:
    digest = hashlib.sha256(f"{os.path.abspath(input_path)}\0{fmt}".encode()).hexdigest()[:12]
    return f"publish-{topic}-{digest}"


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topic", required=True, help="the pidlease topic")
    p.add_argument(
        "--coordinator",
        default=os.environ.get(COORDINATOR_ENV, DEFAULT_COORDINATOR),
        help=f"coordinator URL (env {COORDINATOR_ENV}; default %(default)s)",
    )
    p.add_argument(
        "--master",
        default="local[*]",
        help="Spark master: local[N], local[N,F] (F-1 retries per task), or "
        "spark://host:port (default %(default)s)",
    )
    p.add_argument(
        "--conf",
        action="append",
        metavar="KEY=VALUE",
        help="extra Spark setting, repeatable (overrides pidlease's loopback defaults)",
    )
    p.add_argument(
        "--progress-interval",
        type=float,
        default=2.0,
        metavar="S",
        help="seconds between progress lines (default %(default)s)",
    )


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="pidlease-spark",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = top.add_subparsers(dest="command", required=True)
    pub = sub.add_parser(
        "publish",
        help="publish files to a topic exactly once",
        description="Publish every row of the input to --topic exactly once. "
        "Without a 'value' column each row is encoded as JSON.",
    )
    pub.add_argument("--input", required=True, help="file or directory to read")
    pub.add_argument("--format", required=True, choices=["parquet", "csv", "json"])
    _common(pub)
    pub.add_argument(
        "--key-column", help="column used as the record key (default: 'key' if present)"
    )
    pub.add_argument(
        "--job-name", help="names the producers (default: derived from topic, input, format)"
    )
    pub.add_argument(
        "--partitioning",
        choices=["auto", "spark", "key"],
        default="auto",
        help="topic partition of a row: auto = by key when it has one, else Spark "
        "partition mod N (default %(default)s)",
    )
    pub.add_argument(
        "--min-partitions",
        type=int,
        default=MIN_PARTITIONS_DEFAULT,
        help="how finely input files are split for reading "
        "(spark.sql.files.minPartitionNum); the records do not depend on it "
        "(default %(default)s)",
    )
    pub.add_argument(
        "--buckets",
        type=int,
        default=BUCKETS_DEFAULT,
        help="rows are grouped into this many producers by a hash of the row; part of the "
        "job's identity: re-run a job with the count it first ran with (default %(default)s)",
    )
    pub.add_argument(
        "--partitions",
        type=int,
        default=PARTITIONS_DEFAULT,
        help="Spark tasks of the write (the shuffle by bucket); any number gives the same "
        "records (default %(default)s)",
    )
    pub.add_argument("--csv-no-header", action="store_true", help="CSV files have no header line")
    pub.add_argument(
        "--infer-schema",
        action="store_true",
        help="infer CSV column types (one more pass); otherwise CSV columns are text",
    )
    pub.add_argument("--report", help="also keep the job report (JSON) at this path")
    aud = sub.add_parser("audit", help="audit a topic for duplicates and missing records")
    _common(aud)
    aud.add_argument(
        "--out", required=True, help="directory for report.json and the Parquet tables"
    )
    aud.add_argument(
        "--against",
        metavar="INPUT",
        help="also compare the topic with this input by content: rows missing, rows "
        "more than once (what the per-PID audit cannot see)",
    )
    aud.add_argument("--format", choices=["parquet", "csv", "json"], help="--against's format")
    aud.add_argument("--key-column", help="--against: the key column it was published with")
    aud.add_argument(
        "--id-columns",
        help="--against: compare these input columns (comma-separated) with the same "
        "fields of the records' JSON values, instead of the encoded (key, value)",
    )
    return top


class _Session:
    """The command's Spark session: built (and stopped at the end) unless one is given,
    as the tests give theirs to save a JVM start per command."""

    def __init__(self, args: argparse.Namespace, conf: dict[str, str], given: Any) -> None:
        self.args, self.conf, self.given = args, conf, given
        self.spark: Any = None

    def __enter__(self) -> Any:
        if self.given is not None:
            self.spark = self.given
            for k, v in self.conf.items():
                self.spark.conf.set(k, v)
            return self.spark
        from pidlease.spark.session import build_session, parse_conf

        self.spark = build_session(
            self.args.master,
            app_name=f"pidlease-spark {self.args.command}",
            conf={**self.conf, **parse_conf(self.args.conf)},
        )
        return self.spark

    def __exit__(self, *exc: object) -> None:
        if self.given is None and self.spark is not None:
            self.spark.stop()


def publish(args: argparse.Namespace, spark: Any = None) -> int:
    from pidlease.spark import job_report
    from pidlease.spark.progress import Progress, task_attempts

    job = args.job_name or default_job_name(args.topic, args.input, args.format)
    report_path = args.report or os.path.join(
        tempfile.mkdtemp(prefix="pidlease-spark-"), "job-report.json"
    )
    with _Session(
        args, {"spark.sql.files.minPartitionNum": str(args.min_partitions)}, spark
    ) as session:
        reader = session.read.format(args.format)
        if args.format == "csv":
            reader = reader.option("header", str(not args.csv_no_header).lower()).option(
                "inferSchema", str(args.infer_schema).lower()
            )
        import pidlease.spark

        # The row hash, bucket and shuffle by bucket: a row's producer and id do not
        # depend on how the files are listed or split, nor on the master's cores.
        df = pidlease.spark.bucketed(reader.load(args.input), args.buckets, args.partitions)
        print(
            f"publishing {args.input} ({args.format}) to {args.topic!r} as job {job!r}",
            file=sys.stderr,
        )
        writer = (
            df.write.format("pidlease")
            .option("coordinator", args.coordinator)
            .option("topic", args.topic)
            .option("job_name", job)
            .option("partitioning", args.partitioning)
            .option("report_path", report_path)
            # The report line is printed below, once; the commit would log it too.
            .option("log_report", "false")
        )
        if args.key_column:
            writer = writer.option("key_column", args.key_column)
        group = f"pidlease-publish-{os.getpid()}-{time.monotonic_ns()}"
        session.sparkContext.setJobGroup(group, f"pidlease-spark publish {job}")
        started = time.monotonic()
        try:
            with Progress(session, "publish", interval_s=args.progress_interval):
                writer.mode("append").save()
        finally:
            # A session given by the caller runs its later jobs outside the group.
            for prop in ("spark.jobGroup.id", "spark.job.description"):
                session.sparkContext.setLocalProperty(prop, None)
        elapsed = time.monotonic() - started
        report = job_report.load(report_path)[0]
        # Only the driver knows which attempts were speculative copies.
        try:
            attempts = task_attempts(session, group)
        except Exception as exc:  # noqa: BLE001 - the write is done; report what is known
            print(f"(no task attempts from Spark: {exc}; speculative copies count as retries)")
        else:
            job_report.with_spark_attempts(report, attempts)
    job_report.save(report, report_path, quiet=True)
    print(job_report.one_line(report))
    rate = report["rows"] / max(elapsed, 1e-9)
    print(
        f"{report['rows']} rows in {elapsed:.1f}s ({rate:,.0f} rows/s); job report: {report_path}"
    )
    return 0


def audit(args: argparse.Namespace, spark: Any = None) -> int:
    from pidlease.spark.audit import run_audit, summary, write_report
    from pidlease.spark.progress import Progress

    if args.against and not args.format:
        from pidlease.spark.errors import OptionError

        raise OptionError("--against needs --format (parquet, csv or json)")
    with (
        _Session(args, {}, spark) as session,
        Progress(session, "audit", interval_s=args.progress_interval),
    ):
        report = run_audit(session, args.coordinator, args.topic, args.out)
        if args.against:
            from pidlease.spark.against import compare

            reader = session.read.format(args.format)
            if args.format == "csv":
                reader = reader.option("header", "true")
            ids = [c.strip() for c in (args.id_columns or "").split(",") if c.strip()]
            content = compare(
                session,
                args.coordinator,
                args.topic,
                reader.load(args.against),
                key_column=args.key_column,
                id_columns=ids,
            )
            report["against"] = {"input": args.against, **content}
            report["ok"] = report["ok"] and content["ok"]
            write_report(report, args.out)
    print(summary(report))
    if "against" in report:
        from pidlease.spark.against import summary as content_summary

        print(content_summary(report["against"]))
    print(
        f"report: {Path(args.out) / 'report.json'} (+ partitions, producers, duplicates .parquet)"
    )
    return 0 if report["ok"] else 1


def main(argv: list[str] | None = None, *, spark: Any = None) -> int:
    """Run the command; ``spark``: use this session instead of starting one."""
    args = parser().parse_args(argv)
    from pidlease import errors
    from pidlease.spark.errors import PipelineError

    try:
        return publish(args, spark) if args.command == "publish" else audit(args, spark)
    except (PipelineError, errors.PidleaseError) as exc:
        print(f"pidlease-spark {args.command}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        print(f"pidlease-spark {args.command}: {cause(exc)}", file=sys.stderr)
        if os.environ.get("PIDLEASE_DEBUG"):
            raise
        return 1


_ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Fenced|Failure)): (.+)$")
CAUSES_MAX = 50  # Java cause chains are short; this only bounds a cyclic one


def java_causes(exc: BaseException) -> list[str]:
    """The Java exception chain behind a py4j error, outermost first, each as
    ``Class: message``: empty for a Python exception. py4j's own text is only the handle
    ("An error occurred while calling o58.save"); the cause is in the chain."""
    throwable = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
    chain: list[str] = []
    while throwable is not None and len(chain) < CAUSES_MAX:
        try:
            chain.append(str(throwable.toString()))
            nxt = throwable.getCause()
        except Exception:  # noqa: BLE001 - a gateway gone: keep what was read
            break
        if nxt is None or nxt.equals(throwable):
            break
        throwable = nxt
    return chain


def _innermost(chain: list[str]) -> str:
    """The deepest cause, or the outermost one that still carries its message (Java wraps
    ``error=2, No such file or directory`` in ``Cannot run program "X": error=2, ...``,
    which names the program)."""
    deepest = chain[-1]
    message = deepest.partition(": ")[2]
    if message:
        for outer in chain:
            if message in outer:
                return outer
    return deepest


def _short(line: str) -> str:
    name, sep, message = line.partition(": ")
    return f"{name.rsplit('.', 1)[-1]}{sep}{message}"


def cause(exc: BaseException) -> str:
    """The line that says what went wrong. Spark wraps an error raised in a data source
    (or a task) in its own, with the Python traceback as text: the last "Name: message"
    line of ours is the cause, not the first line of Spark's. A py4j error names only a
    Java object ("o58.save"): its innermost Java cause says what failed (a Python worker
    that could not start, e.g. a bad ``PYSPARK_PYTHON``), or, when a Python worker
    failed, the traceback inside it does (e.g. ``ModuleNotFoundError``)."""
    chain = java_causes(exc)
    text = "\n".join([str(exc), *chain])
    ours = mine = None
    for line in text.splitlines():
        m = _ERROR_LINE.match(line.strip())
        if m and m.group(1) != "Py4JJavaError":
            mine = f"{m.group(1)}: {m.group(2)}"
            if "pidlease." in line:
                ours = mine
    if ours:
        return ours
    python_side = [c for c in chain if "PythonException" in c.split(": ", 1)[0]]
    if mine and (python_side or not chain):
        return mine  # the Python traceback's last error line
    if chain:
        return _short(_innermost(chain))
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return mine or f"{type(exc).__name__}: {first}"


if __name__ == "__main__":
    raise SystemExit(main())
