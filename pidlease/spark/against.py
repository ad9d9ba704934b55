"""The audit by content (``pidlease-spark audit --against INPUT``): the topic compared
with the data set that was published to it.

``pidlease verify`` and the per-PID audit look at (PID, partition, sequence) only: they
find an id twice or a hole in a strict topic's ids, but not a row written under two ids
nor a row never sent (issue 30: a replay in another order did both, and both audits said
OK). This compares what the rows *are*:

- by default, the multiset of (key, value): the input is encoded as the sink encodes it
  (``RecordEncoder``, with the same key column), so a row's record is known exactly;
- with ``id_columns``, the multiset of those columns: from the input's columns, and from
  each record's JSON value (for inputs published without a ``value`` column).

``missing``: rows of the input with fewer copies in the topic than in the input (how
many copies short, summed); ``extra``: more copies in the topic than in the input (how
many too many, summed). Exactly once is both 0. Up to ``EXAMPLES`` rows of each are kept.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

EXAMPLES = 20


def encoded(df: Any, key_column: str | None) -> Any:
    """``df``'s rows as the sink would publish them: (key BINARY, value BINARY)."""
    from pidlease.spark.encoding import RecordEncoder
    from pidlease.spark.sink import _columns

    encoder = RecordEncoder.for_columns(_columns(df.schema), key_column)

    def encode(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for batch in batches:
            keys, values = encoder.encode_columns(batch)
            if keys is None:
                keys = pa.nulls(len(values), pa.binary())
            yield pa.record_batch({"key": keys, "value": values})

    return df.mapInArrow(encode, "key BINARY, value BINARY")


def compare(
    spark: Any,
    coordinator: str,
    topic: str,
    input_df: Any,
    *,
    key_column: str | None = None,
    id_columns: Sequence[str] = (),
    api_token: str | None = None,
) -> dict[str, Any]:
    from pyspark.sql import functions as F

    reader = spark.read.format("pidlease").option("coordinator", coordinator).option("topic", topic)
    if api_token:
        reader = reader.option("api_token", api_token)
    records = reader.load().select("key", "value")
    if id_columns:
        text = F.col("value").cast("string")
        cols = [f"c{i}" for i in range(len(id_columns))]
        got = records.select(
            *[
                F.get_json_object(text, f"$.{name}").alias(c)
                for name, c in zip(id_columns, cols, strict=True)
            ]
        )
        want = input_df.select(
            *[
                F.col(f"`{name}`").cast("string").alias(c)
                for name, c in zip(id_columns, cols, strict=True)
            ]
        )
    else:
        cols = ["key", "value"]
        got, want = records, encoded(input_df, key_column)
    g = got.groupBy(*cols).agg(F.count(F.lit(1)).alias("in_topic"))
    w = want.groupBy(*cols).agg(F.count(F.lit(1)).alias("in_input"))
    joined = (
        g.join(w, on=[g[c].eqNullSafe(w[c]) for c in cols], how="full_outer")
        .select(
            *[F.coalesce(g[c], w[c]).alias(c) for c in cols],
            F.coalesce("in_topic", F.lit(0)).alias("in_topic"),
            F.coalesce("in_input", F.lit(0)).alias("in_input"),
        )
        .cache()
    )
    try:
        totals = joined.agg(
            F.sum("in_input").alias("input_rows"),
            F.sum("in_topic").alias("topic_records"),
            F.sum(F.greatest(F.col("in_input") - F.col("in_topic"), F.lit(0))).alias("missing"),
            F.sum(F.greatest(F.col("in_topic") - F.col("in_input"), F.lit(0))).alias("extra"),
        ).first()
        bad = joined.where(F.col("in_topic") != F.col("in_input"))
        examples = [
            {
                **{
                    c: (v.decode("utf-8", "replace") if isinstance(v, bytes | bytearray) else v)
                    for c, v in zip(cols, (r[c] for c in cols), strict=True)
                },
                "in_topic": int(r["in_topic"]),
                "in_input": int(r["in_input"]),
            }
            for r in bad.limit(EXAMPLES).collect()
        ]
    finally:
        joined.unpersist()
    missing, extra = int(totals["missing"] or 0), int(totals["extra"] or 0)
    return {
        "by": list(id_columns) or ["key", "value"],
        "input_rows": int(totals["input_rows"] or 0),
        "topic_records": int(totals["topic_records"] or 0),
        "missing": missing,
        "extra": extra,
        "ok": missing == 0 and extra == 0,
        "examples": examples,
    }


def summary(result: dict[str, Any]) -> str:
    verdict = "EVERY ROW ONCE: OK" if result["ok"] else "EVERY ROW ONCE: VIOLATED"
    lines = [
        f"by content ({', '.join(result['by'])}): {result['input_rows']:,} input rows, "
        f"{result['topic_records']:,} records in the topic",
        f"{verdict} - {result['missing']:,} rows missing, {result['extra']:,} copies too many",
    ]
    for e in result["examples"][:5]:
        shown = {k: v for k, v in e.items() if k not in ("in_topic", "in_input")}
        lines.append(f"  {shown}: {e['in_input']} in the input, {e['in_topic']} in the topic")
    return "\n".join(lines)
