"""``bucketed(df)``: the columns and the shuffle that make a row's identity a function of
the row (``pidlease.spark.sequencing``).

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

from pidlease.spark.sequencing import (
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
    n = partitions or int(df.sparkSession.conf.get("spark.sql.shuffle.partitions"))
    # Spark's hash partitioning would put bucket b in pmod(murmur3(b), n): buckets pile up
    # in some tasks and leave others empty. Shuffling by a stand-in whose murmur3 lands in
    # partition b mod n spreads them evenly (the partition holding a bucket does not
    # matter to the records, only that it is one).
    keys = shuffle_keys(buckets, n)
    stand_in = F.element_at(F.array(*[F.lit(k) for k in keys]), F.col(BUCKET_COLUMN) + 1)
    return out.repartition(n, stand_in)


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF


def spark_hash_int(value: int, seed: int = 42) -> int:
    """Spark's ``Murmur3Hash`` of one int column (``Murmur3_x86_32.hashInt``), as a signed
    32-bit int: what ``HashPartitioning`` takes ``pmod`` of."""
    k1 = (value & 0xFFFFFFFF) * 0xCC9E2D51 & 0xFFFFFFFF
    k1 = _rotl(k1, 15) * 0x1B873593 & 0xFFFFFFFF
    h1 = _rotl(seed ^ k1, 13)
    h1 = (h1 * 5 + 0xE6546B64) & 0xFFFFFFFF
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & 0xFFFFFFFF
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & 0xFFFFFFFF
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def shuffle_keys(buckets: int, partitions: int) -> list[int]:
    """For each bucket b an int whose Spark hash partition (of ``partitions``) is
    b mod partitions."""
    want: dict[int, list[int]] = {p: [] for p in range(partitions)}  # ints landing there
    need = {b % partitions for b in range(buckets)}
    candidate = 0
    while any(len(want[p]) < 1 for p in need):
        want[spark_hash_int(candidate) % partitions].append(candidate)
        candidate += 1
    return [want[b % partitions][0] for b in range(buckets)]
