"""The report of one write job (or one streaming micro-batch), from the tasks' commit
messages, made on the driver when Spark commits or aborts the write.

Spark runs ``commit``/``abort`` in a Python worker of its own, not in the user's process,
so the report goes to a file (option ``report_path``: a JSON object for a batch write,
one JSON line per micro-batch for a stream) and to the log; ``pidlease-spark publish``
reads the file back to print it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("pidlease.spark.job_report")

COUNTERS = ("rows", "skipped", "sent", "appended", "duplicates")


def summarize(
    messages: Sequence[Any], *, topic: str, committed: bool, batch_id: int | None = None
) -> dict[str, Any]:
    """Totals over the tasks' ``PartitionCommit`` messages (None for a failed task)."""
    done = [m for m in messages if m is not None]
    report: dict[str, Any] = {
        "topic": topic,
        "committed": committed,
        "tasks": len(messages),
        "failed_tasks": len(messages) - len(done),
    }
    if batch_id is not None:
        report["batch_id"] = batch_id
    for c in COUNTERS:
        report[c] = sum(getattr(m, c) for m in done)
    # A fenced attempt's task fails and brings no message back: the attempt that took
    # its producer over recorded it (``attempt.takeover_record``, or the injected copy).
    report["fenced_attempts"] = sum(len(m.fenced_attempts) for m in done)
    report["retried_tasks"] = sum(1 for m in done if m.attempt > 0 and not m.speculative)
    report["speculative_tasks"] = sum(1 for m in done if m.speculative)
    # A fenced attempt that waited for the newer one's rows ends as a no-op success; when
    # Spark keeps its message, that task's rows were written by the attempt that fenced it.
    report["fenced_tasks"] = sum(1 for m in done if getattr(m, "fenced", False))
    report["producers"] = sorted({n for m in done for n in m.producer_name.split(",") if n})
    if batch_id is not None:
        report["skipped_whole"] = bool(report["rows"]) and report["skipped"] == report["rows"]
    report["partitions"] = [
        {
            "spark_partition": m.spark_partition,
            "attempt": m.attempt,
            "speculative": m.speculative,
            "producer_name": m.producer_name,
            "pid": m.pid,
            "generation": m.generation,
            **{c: getattr(m, c) for c in COUNTERS},
            "sequences": {str(tp): span for tp, span in sorted(m.sequences.items())},
            "fenced_attempts": m.fenced_attempts,
            "fenced": getattr(m, "fenced", False),
            "buckets": getattr(m, "buckets", []),
        }
        for m in sorted(done, key=lambda m: m.spark_partition)
    ]
    report["time_ms"] = int(time.time() * 1000)
    return report


def one_line(report: dict[str, Any]) -> str:
    where = f" batch {report['batch_id']}" if "batch_id" in report else ""
    state = "committed" if report["committed"] else "ABORTED"
    return (
        f"pidlease write to {report['topic']!r}{where} {state}: {report['rows']} rows, "
        f"{report['appended']} appended, {report['skipped']} skipped (already written), "
        f"{report['duplicates']} duplicates, {report['tasks']} tasks "
        f"({report['failed_tasks']} failed, {report['retried_tasks']} retried, "
        f"{report.get('speculative_tasks', 0)} speculative, "
        f"{report['fenced_attempts']} earlier attempts fenced)"
        + (" SKIPPED WHOLE: every row was already written" if report.get("skipped_whole") else "")
    )


def with_spark_attempts(report: dict[str, Any], attempts: Sequence[dict[str, Any]]) -> None:
    """Add what Spark's driver knows about the write's task attempts to ``report``: an
    executor cannot tell a speculative copy from a retry (both are attempt > 0), the
    driver can. ``attempts``: one per task attempt of the write's stage, with ``index``
    (the Spark partition), ``attempt``, ``speculative`` and ``status`` (SUCCESS, FAILED,
    KILLED, RUNNING), as ``pidlease.spark.progress.task_attempts`` reads them."""
    spec = {(a["index"], a["attempt"]) for a in attempts if a["speculative"]}
    for p in report["partitions"]:
        if (p["spark_partition"], p["attempt"]) in spec:
            p["speculative"] = True
    parts = report["partitions"]
    report["speculative_tasks"] = sum(1 for p in parts if p["speculative"])
    report["retried_tasks"] = sum(1 for p in parts if p["attempt"] > 0 and not p["speculative"])
    statuses = [str(a["status"]).upper() for a in attempts]
    report["spark_attempts"] = {
        "launched": len(attempts),
        "speculative": sum(1 for a in attempts if a["speculative"]),
        "failed": statuses.count("FAILED"),
        "killed": statuses.count("KILLED"),
    }


def save(
    report: dict[str, Any], path: str | None, *, append: bool = False, quiet: bool = False
) -> None:
    """Write the report to ``path`` (atomically when not appending) and log it, unless
    ``quiet`` (``pidlease-spark publish`` prints the report itself: once)."""
    if not quiet:
        log.warning("%s", one_line(report))  # WARN: Spark workers show WARN and above
    if not path:
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if append:
        with open(p, "a", encoding="utf-8") as f:
            f.write(json.dumps(report, sort_keys=True) + "\n")
        return
    tmp = p.with_name(p.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(report, indent=2, sort_keys=True), encoding="utf-8")
    os.replace(tmp, p)


def load(path: str | Path) -> list[dict[str, Any]]:
    """The report(s) in a file written by ``save`` (one, or one per line)."""
    text = Path(path).read_text(encoding="utf-8").strip()
    if not text:
        return []
    try:
        return [json.loads(text)]
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
