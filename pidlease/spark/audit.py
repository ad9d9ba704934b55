"""The exactly-once audit of a topic, in Spark (``pidlease-spark audit``).

Spark reads the whole topic through the ``pidlease`` data source and aggregates per
(topic partition, PID): records, distinct sequence ids, first/last sequence, first/last
offset and time. From those few rows (``build_report``, pure) follow:

- duplicates: records minus distinct sequences, per (PID, partition), with examples of
  the (partition, PID, sequence) triples seen more than once;
- missing: on a strict topic, sequences absent between a PID's first and last in the
  partition (each one a record that should be there: the audit fails);
- allowed gaps: on a monotonic topic the ids are application-chosen (a stream's
  ``batch_id * 2**32 + position`` jumps at every micro-batch), so a hole is no missing
  record. They are reported apart: how many holes (``allowed_gaps``, one per jump) and
  how many ids they skip (``skipped_ids``), and never fail the audit. Counting skipped
  ids as "gaps" reported 25,769,927,760 of them for a six-batch stream;
- per PID: its partitions' first/last offsets, and from the coordinator (``GET
  /v1/pids``) its producer name, generation, state, last use and time to expiry. A PID in
  the log that the coordinator no longer knows (past retention) is marked ``unknown``.

PID 0 (not idempotent) is counted per partition but not checked, as ``pidlease verify``
does. The report is written as ``report.json`` and as Parquet tables
(``partitions.parquet``, ``producers.parquet``, ``duplicates.parquet``) under the output
directory; it is exactly-once (``ok``) when there are no duplicates and no missing
records.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pidlease import errors
from pidlease.client.lease_client import LeaseClient

DUPLICATE_EXAMPLES_MAX = 100
PID_VIEWS_MAX = 100_000  # the coordinator's default cap on GET /v1/pids


def build_report(
    *,
    topic: str,
    dedup: str,
    partitions: int,
    groups: Sequence[dict[str, Any]],
    duplicate_examples: Sequence[dict[str, Any]],
    pids: Sequence[dict[str, Any]],
    now_ms: int,
) -> dict[str, Any]:
    """The audit from per-(partition, PID) aggregates and the coordinator's PID views."""
    parts = [
        {
            "partition": p,
            "records": 0,
            "producers": 0,
            "unchecked_records": 0,
            "duplicates": 0,
            "missing": 0,
            "allowed_gaps": 0,
            "skipped_ids": 0,
        }
        for p in range(partitions)
    ]
    strict = dedup == "strict"
    known = {int(v["pid"]): v for v in pids}
    producers: list[dict[str, Any]] = []
    by_pid: dict[int, dict[str, Any]] = {}
    for g in sorted(groups, key=lambda g: (g["pid"], g["partition"])):
        p, pid, records = int(g["partition"]), int(g["pid"]), int(g["records"])
        part = parts[p]
        part["records"] += records
        if pid == 0:
            part["unchecked_records"] += records
            continue
        distinct = int(g["distinct_sequences"])
        first_seq, last_seq = int(g["first_sequence"]), int(g["last_sequence"])
        absent = (last_seq - first_seq + 1) - distinct
        holes = max(1, int(g.get("holes") or 0)) if absent else 0  # ids absent: a hole at least
        row: dict[str, Any] = {
            "pid": pid,
            "partition": p,
            "records": records,
            "duplicates": records - distinct,
            "missing": absent if strict else 0,
            "allowed_gaps": 0 if strict else holes,
            "skipped_ids": 0 if strict else absent,
            "first_sequence": first_seq,
            "last_sequence": last_seq,
            "first_offset": int(g["first_offset"]),
            "last_offset": int(g["last_offset"]),
            "first_timestamp_ms": g.get("first_timestamp_ms"),
            "last_timestamp_ms": g.get("last_timestamp_ms"),
        }
        producers.append(row)
        part["producers"] += 1
        for k in ("duplicates", "missing", "allowed_gaps", "skipped_ids"):
            part[k] += row[k]
        entry = by_pid.get(pid)
        if entry is None:
            entry = by_pid[pid] = _pid_entry(pid, known.get(pid), now_ms)
        entry["records"] += records
        entry["partitions"].append(
            {
                k: row[k]
                for k in (
                    "partition",
                    "records",
                    "first_offset",
                    "last_offset",
                    "first_sequence",
                    "last_sequence",
                    "duplicates",
                    "missing",
                    "allowed_gaps",
                    "skipped_ids",
                )
            }
        )
    duplicates = sum(p["duplicates"] for p in parts)
    missing = sum(p["missing"] for p in parts)
    ok = duplicates == 0 and missing == 0
    return {
        "topic": topic,
        "dedup": dedup,
        "ok": ok,
        "audited_at_ms": now_ms,
        "records": sum(p["records"] for p in parts),
        "unchecked_records": sum(p["unchecked_records"] for p in parts),
        "duplicates": duplicates,
        "missing": missing,
        "gaps_allowed": not strict,
        "allowed_gaps": sum(p["allowed_gaps"] for p in parts),
        "skipped_ids": sum(p["skipped_ids"] for p in parts),
        "pids": len(by_pid),
        "partitions": parts,
        "producers": producers,
        "pid_usage": [by_pid[k] for k in sorted(by_pid)],
        "duplicate_examples": list(duplicate_examples)[:DUPLICATE_EXAMPLES_MAX],
    }


def _pid_entry(pid: int, view: dict[str, Any] | None, now_ms: int) -> dict[str, Any]:
    entry: dict[str, Any] = {"pid": pid, "records": 0, "partitions": []}
    if view is None:
        entry.update(
            producer_name=None,
            generation=None,
            state="unknown",
            last_use_ms=None,
            expires_at_ms=None,
            time_to_expiry_ms=None,
        )
        return entry
    expires_at = view.get("expires_at_ms")
    entry.update(
        producer_name=view.get("producer_name"),
        generation=view.get("generation"),
        state=view.get("state"),
        last_use_ms=view.get("last_use_ms"),
        expires_at_ms=expires_at,
        time_to_expiry_ms=None if expires_at is None else max(0, int(expires_at) - now_ms),
    )
    return entry


def summary(report: dict[str, Any]) -> str:
    lines = [
        (
            f"audit of topic {report['topic']!r} ({report['dedup']}): {report['records']} records "
            f"from {report['pids']} PIDs in {len(report['partitions'])} partitions"
        )
    ]
    for p in report["partitions"]:
        lines.append(
            f"  partition {p['partition']}: {p['records']:,} records, {p['producers']} PIDs, "
            f"{p['duplicates']:,} duplicates, {_missing(report, p)}"
        )
    verdict = "EXACTLY-ONCE: OK" if report["ok"] else "EXACTLY-ONCE: VIOLATED"
    lines.append(f"{verdict} - {report['duplicates']:,} duplicates, {_missing(report, report)}")
    for d in report["duplicate_examples"][:5]:
        lines.append(
            f"  duplicate: partition {d['partition']} pid {d['pid']} sequence "
            f"{d['sequence_id']} x{d['copies']}"
        )
    return "\n".join(lines)


def _missing(report: dict[str, Any], figures: dict[str, Any]) -> str:
    """ "N missing", and on a monotonic topic what missing cannot be told from: its
    allowed gaps (holes in application-chosen ids, e.g. between micro-batches)."""
    if not report["gaps_allowed"]:
        return f"{figures['missing']:,} missing"
    return (
        f"{figures['missing']:,} missing, {figures['allowed_gaps']:,} allowed gaps "
        f"(monotonic ids, {figures['skipped_ids']:,} ids skipped)"
    )


# -- Spark side ----------------------------------------------------------------------------
def aggregate(df: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(per-(partition, PID) aggregates, duplicate examples) of a topic DataFrame."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    # A hole is a jump of more than one from the PID's previous sequence in the partition
    # (a copy of a sequence is a jump of 0, counted as a duplicate instead).
    order = Window.partitionBy("partition", "pid").orderBy("sequence_id")
    jump = F.col("sequence_id") - F.lag("sequence_id").over(order)
    groups = (
        df.withColumn("hole", F.when(jump > 1, 1).otherwise(0))
        .groupBy("partition", "pid")
        .agg(
            F.count(F.lit(1)).alias("records"),
            F.countDistinct("sequence_id").alias("distinct_sequences"),
            F.min("sequence_id").alias("first_sequence"),
            F.max("sequence_id").alias("last_sequence"),
            F.min("offset").alias("first_offset"),
            F.max("offset").alias("last_offset"),
            F.unix_millis(F.min("timestamp")).alias("first_timestamp_ms"),
            F.unix_millis(F.max("timestamp")).alias("last_timestamp_ms"),
            F.sum("hole").alias("holes"),
        )
        .collect()
    )
    rows = [r.asDict() for r in groups]
    examples: list[dict[str, Any]] = []
    if any(r["pid"] != 0 and r["records"] != r["distinct_sequences"] for r in rows):
        dup = (
            df.where(F.col("pid") != 0)
            .groupBy("partition", "pid", "sequence_id")
            .agg(
                F.count(F.lit(1)).alias("copies"),
                F.min("offset").alias("first_offset"),
                F.max("offset").alias("last_offset"),
            )
            .where(F.col("copies") > 1)
            .orderBy("partition", "pid", "sequence_id")
            .limit(DUPLICATE_EXAMPLES_MAX)
            .collect()
        )
        examples = [r.asDict() for r in dup]
    return rows, examples


def run_audit(
    spark: Any,
    coordinator: str,
    topic: str,
    out_dir: str | Path | None = None,
    *,
    api_token: str | None = None,
) -> dict[str, Any]:
    """Audit ``topic``; write the report under ``out_dir`` when given; return it."""
    with LeaseClient(coordinator, api_token=api_token) as client:
        info = client.topic(topic)
    reader = spark.read.format("pidlease").option("coordinator", coordinator).option("topic", topic)
    if api_token:
        reader = reader.option("api_token", api_token)
    df = reader.load().select("partition", "offset", "pid", "sequence_id", "timestamp")
    groups, examples = aggregate(df)
    pids = _pid_views(coordinator, api_token)  # after the read: last use is then current
    report = build_report(
        topic=topic,
        dedup=info.dedup,
        partitions=info.partitions,
        groups=groups,
        duplicate_examples=examples,
        pids=pids,
        now_ms=int(time.time() * 1000),
    )
    if out_dir is not None:
        write_report(report, out_dir)
    return report


def _pid_views(coordinator: str, api_token: str | None) -> list[dict[str, Any]]:
    with LeaseClient(coordinator, api_token=api_token) as client:
        try:
            return client.pids(limit=PID_VIEWS_MAX)
        except errors.InvalidRequest:  # a coordinator configured with a lower cap
            return client.pids(limit=1000)


def write_report(report: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """``report.json`` plus one Parquet table per list; returns the files written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "report.json"]
    written[0].write_text(json.dumps(report, indent=2, sort_keys=True), encoding="utf-8")
    usage = {u["pid"]: u for u in report["pid_usage"]}
    producers = [
        {
            **row,
            **{
                k: usage[row["pid"]][k]
                for k in (
                    "producer_name",
                    "generation",
                    "state",
                    "last_use_ms",
                    "expires_at_ms",
                    "time_to_expiry_ms",
                )
            },
        }
        for row in report["producers"]
    ]
    tables = {
        "partitions": (
            report["partitions"],
            pa.schema(
                [
                    ("partition", pa.int32()),
                    ("records", pa.int64()),
                    ("producers", pa.int64()),
                    ("unchecked_records", pa.int64()),
                    ("duplicates", pa.int64()),
                    ("missing", pa.int64()),
                    ("allowed_gaps", pa.int64()),
                    ("skipped_ids", pa.int64()),
                ]
            ),
        ),
        "producers": (
            producers,
            pa.schema(
                [
                    ("pid", pa.int64()),
                    ("partition", pa.int32()),
                    ("records", pa.int64()),
                    ("duplicates", pa.int64()),
                    ("missing", pa.int64()),
                    ("allowed_gaps", pa.int64()),
                    ("skipped_ids", pa.int64()),
                    ("first_sequence", pa.int64()),
                    ("last_sequence", pa.int64()),
                    ("first_offset", pa.int64()),
                    ("last_offset", pa.int64()),
                    ("first_timestamp_ms", pa.int64()),
                    ("last_timestamp_ms", pa.int64()),
                    ("producer_name", pa.string()),
                    ("generation", pa.int64()),
                    ("state", pa.string()),
                    ("last_use_ms", pa.int64()),
                    ("expires_at_ms", pa.int64()),
                    ("time_to_expiry_ms", pa.int64()),
                ]
            ),
        ),
        "duplicates": (
            report["duplicate_examples"],
            pa.schema(
                [
                    ("partition", pa.int32()),
                    ("pid", pa.int64()),
                    ("sequence_id", pa.int64()),
                    ("copies", pa.int64()),
                    ("first_offset", pa.int64()),
                    ("last_offset", pa.int64()),
                ]
            ),
        ),
    }
    for name, (rows, schema) in tables.items():
        path = out / f"{name}.parquet"
        pq.write_table(pa.Table.from_pylist(list(rows), schema=schema), path)
        written.append(path)
    return written
