"""``bucketed(df)``: the columns and the shuffle that make a row's identity a function of
the row (``pipeline.sequencing``).

It adds the row's 64-bit hash (``xxhash64`` of all its columns, computed by Spark in the
JVM: the same on every run, core count and split) and its bucket (hash mod ``buckets``,
the count kept in the bucket column's metadata, which the sink reads), and repartitions
by the bucket, so every row of a bucket is in exactly one Spark task: the bucket's
producer is then written by one task (and its retries or speculative copies, which take
it over), never by two tasks that would fence each other.

The shuffle is the price: Spark's data source API for Python lets a sink ask for no
distribution, so the writer cannot add it itself; the sink refuses rows without these
columns rather than number them by position.
"""

from __future__ import annotations

from typing import Any

from pipeline.sequencing import (
    BUCKET_COLUMN,
    BUCKETS_DEFAULT,
    BUCKETS_MAX,
    BUCKETS_METADATA,
    HASH_COLUMN,
)


def bucketed(df: Any, buckets: int = BUCKETS_DEFAULT, partitions: int | None = None) -> Any:
    """``df`` with the row hash and bucket columns, shuffled by bucket into
    ``partitions`` Spark partitions (default ``spark.sql.shuffle.partitions``). The
    bucket count is part of the job's identity (it is in the producer names): re-run a
    job with the count it was first run with."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import MapType

    if not 1 <= buckets <= BUCKETS_MAX:
        raise ValueError(f"buckets must be in 1..{BUCKETS_MAX}, not {buckets}")
    names = [f.name for f in df.schema.fields]
    clash = {HASH_COLUMN, BUCKET_COLUMN} & set(names)
    if clash:
        raise ValueError(f"the DataFrame already has {sorted(clash)}: bucket it once")
    # xxhash64 takes no map: a map is hashed through its JSON text
    cols = [
        F.to_json(F.col(f"`{f.name}`")) if isinstance(f.dataType, MapType) else F.col(f"`{f.name}`")
        for f in df.schema.fields
    ]
    h = F.xxhash64(*cols)
    out = df.select(
        "*",
        h.alias(HASH_COLUMN),
        F.pmod(h, F.lit(buckets))
        .cast("int")
        .alias(BUCKET_COLUMN, metadata={BUCKETS_METADATA: buckets}),
    )
    col = F.col(BUCKET_COLUMN)
    return out.repartition(partitions, col) if partitions else out.repartition(col)
