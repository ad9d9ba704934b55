"""A write's attempt (a batch task or a micro-batch's) on the SDK's columnar path: Arrow
batches in, ``send_batch`` calls out, no Python object per row.

``ColumnarAttempt`` takes the task's rows as Arrow record batches, each with the row
hash and bucket columns that ``pidlease.spark.bucketed`` adds (``sequencing.HASH_COLUMN``,
``BUCKET_COLUMN``), and works on whole columns: the encoder's key and value arrays
(``RecordEncoder.encode_columns``), each row's topic partition (``route``'s rules: the
SDK's key hash ``crc32_keys``, or the bucket), then the order rows are numbered in, which
depends on the rows only (``sequencing.canonical_columns``: bucket, topic partition, row
hash, bytes), each row's sequence (its position in its (bucket, topic partition) group:
0, 1, 2, ... for a batch write, ``batch_id * 2**32`` + 0, 1, 2, ... for a micro-batch),
rows at or below the takeover's durable highwater skipped (``Resume``), and then one
``send_batch`` per (bucket, topic partition) group (cut at ``batch_records_max``...
by the SDK) with explicit ids, through the bucket's producer. A plain DataFrame (no
bucket columns, ``settings.bucketed`` False) is one bucket, the task's Spark partition,
with row hash 0, and its order is one Arrow sort (``sequencing.content_order_columns``).
The canonical order needs the whole task: its encoded keys and values are held in
memory until they are sent (about the size of the task's records). ``sequencing.plan``
is the pure reference (tests/unit/spark/test_columnar.py compares them).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pidlease import errors
from pidlease.client.record_columns import crc32_keys
from pidlease.spark.attempt import Attempt, PartitionCommit
from pidlease.spark.encoding import RecordEncoder
from pidlease.spark.errors import AttemptFenced, PipelineError, StreamIdentityError
from pidlease.spark.sequencing import (
    BUCKET_COLUMN,
    HASH_COLUMN,
    STREAM_BATCH_ID_MAX,
    STREAM_POSITION_BITS,
    Resume,
    Routing,
    canonical_columns,
    content_order_columns,
    first_sequence,
    group_positions,
    stream_sequence,
)

log = logging.getLogger("pidlease.spark.columnar")


def route_column(keys: Any, buckets: Any, *, routing: Routing, partitions: int) -> Any:
    """The topic partition of each row (numpy int64), as ``sequencing.route`` gives it row
    by row (``buckets``: numpy int64, the rows' buckets)."""
    import numpy as np

    n = len(buckets)
    fallback = buckets % partitions
    if routing is Routing.SPARK or keys is None:
        if routing is Routing.KEY and n:
            raise ValueError("partitioning 'key' needs a key on every row; this row has none")
        return fallback.astype(np.int64)
    parts = (crc32_keys(keys) % np.uint32(partitions)).astype(np.int64)
    if keys.null_count:
        if routing is Routing.KEY:
            raise ValueError("partitioning 'key' needs a key on every row; this row has none")
        valid = np.asarray(keys.is_valid().to_numpy(zero_copy_only=False))
        parts[~valid] = fallback[~valid]
    return parts


def _column(batch: Any, name: str) -> Any:
    import numpy as np

    try:
        col = batch.column(name)
    except KeyError:
        raise PipelineError(
            f"the rows lack the column {name!r}: write pidlease.spark.bucketed(df), which adds "
            f"the row hash and bucket and the shuffle that puts each bucket in one task"
        ) from None
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.int64)


def check_stream_identity(job: str, batch_id: int, resume: Mapping[int, Resume]) -> None:
    """A stream's producers never hold ids of a later micro-batch than the one being
    written: a restart replays the last batch at most. Ids beyond it mean this query is
    not the one that used the job name (a fresh checkpoint restarts batch ids at 0, and
    every row would be skipped as already written)."""
    floor = stream_sequence(batch_id + 1, 0) if batch_id < STREAM_BATCH_ID_MAX else None
    if floor is None:
        return
    top = max((h for r in resume.values() for h in r.last_sequence.values()), default=-1)
    if top >= floor:
        raise StreamIdentityError(
            f"job_name {job!r} was used by a streaming query that reached micro-batch "
            f"{top >> STREAM_POSITION_BITS}; this query is at micro-batch {batch_id}, so "
            f"it does not run from that query's checkpoint and every row would be skipped "
            f"as already written. To resume, start the query with the checkpointLocation "
            f"that job name was used with; to start anew, give a new job_name option."
        )


class Columns:
    """A task's rows, encoded and in canonical order."""

    def __init__(
        self,
        encoder: RecordEncoder,
        batches: Iterable[Any],
        buckets_max: int,
        plain_partition: int | None = None,
    ) -> None:
        """``plain_partition``: the Spark partition of a plain (un-bucketed) task, whose
        rows are all of that bucket with row hash 0; None: the rows carry the columns."""
        import numpy as np
        import pyarrow as pa

        self.plain = plain_partition is not None

        keys: list[Any] = []
        values: list[Any] = []
        buckets: list[Any] = []
        hashes: list[Any] = []
        for batch in batches:
            if not batch.num_rows:
                continue
            k, v = encoder.encode_columns(batch)
            keys.append(k)
            values.append(v)
            if plain_partition is not None:
                buckets.append(np.full(batch.num_rows, plain_partition, dtype=np.int64))
                hashes.append(np.zeros(batch.num_rows, dtype=np.int64))
            else:
                buckets.append(_column(batch, BUCKET_COLUMN))
                hashes.append(_column(batch, HASH_COLUMN))
        self.n = sum(len(v) for v in values)
        if not self.n:
            self.keys = None
            self.values = pa.array([], pa.binary())
            self.buckets = self.hashes = np.zeros(0, dtype=np.int64)
            return
        self.keys = None if keys[0] is None else pa.concat_arrays(keys)
        self.values = pa.concat_arrays(values)
        self.buckets = np.concatenate(buckets)
        self.hashes = np.concatenate(hashes)
        bad = (self.buckets < 0) | (self.buckets >= buckets_max)
        if not self.plain and bad.any():
            raise PipelineError(
                f"a row's bucket {int(self.buckets[bad][0])} is outside 0..{buckets_max - 1} "
                f"(the bucket count the write was planned with)"
            )

    def distinct_buckets(self) -> list[int]:
        import numpy as np

        return [int(b) for b in np.unique(self.buckets)]


class ColumnarAttempt(Attempt):
    def run_columns(
        self,
        encoder: RecordEncoder,
        batches: Iterable[Any],
        hooks: Mapping[int, Callable[[], Any]] | None = None,
    ) -> PartitionCommit:
        """Publish the task's Arrow ``batches``. ``hooks[i]()`` runs just before the row
        sent ``i``-th (in the canonical order; fault injection); when it returns an
        awaitable, the attempt awaits it (on its event loop, so what was sent goes on
        being delivered and the leases renewed)."""
        plain = None if self.settings.bucketed else self.task.spark_partition
        cols = Columns(encoder, batches, self.settings.buckets, plain)
        buckets = cols.distinct_buckets()
        commit = self.new_commit(buckets)
        if not cols.n:
            # An empty task (common in micro-batches) leases nothing: a lease would be a
            # takeover, with a fence record in every partition, for no row.
            return commit
        planned_last: dict[int, dict[int, int]] = {}
        try:
            return asyncio.run(self._run(cols, buckets, commit, planned_last, hooks or {}))
        except AttemptFenced as fenced:
            return self.await_newer(commit, fenced, planned_last)

    async def _run(
        self,
        cols: Columns,
        buckets: list[int],
        commit: PartitionCommit,
        planned_last: dict[int, dict[int, int]],
        hooks: Mapping[int, Callable[[], Any]],
    ) -> PartitionCommit:
        import numpy as np
        import pyarrow as pa

        t = self.task
        producers = await self.lease(buckets, commit)
        pending: deque[Any] = deque()
        self._pending, self._commit = pending, commit
        ok = False
        try:
            partitions = producers[buckets[0]].partitions
            resume = {b: Resume(last) for b, last in self.durable.items()}
            if t.batch_id is not None:
                check_stream_identity(self.job, t.batch_id, resume)
            parts = route_column(
                cols.keys, cols.buckets, routing=self.settings.routing, partitions=partitions
            )
            if cols.plain:  # one bucket, hash 0: by partition, key and value bytes
                order = content_order_columns(parts, cols.keys, cols.values)
            else:
                order = canonical_columns(cols.buckets, parts, cols.hashes, cols.keys, cols.values)
            b_sorted, p_sorted = cols.buckets[order], parts[order]
            positions = group_positions(b_sorted, p_sorted)
            base = first_sequence(t.batch_id)
            n = cols.n
            commit.rows = n
            # group boundaries (bucket, topic partition), then cut at hook positions
            new = np.ones(n, dtype=bool)
            new[1:] = (b_sorted[1:] != b_sorted[:-1]) | (p_sorted[1:] != p_sorted[:-1])
            for h in hooks:
                if 0 < h < n:
                    new[h] = True
            starts = [*np.flatnonzero(new).tolist(), n]
            for s, e in itertools.pairwise(starts):
                hook = hooks.get(s)
                if hook is not None:
                    pause = hook()
                    if inspect.isawaitable(pause):
                        # a stall: awaited on this loop, so the senders go on delivering
                        await pause
                b, tp = int(b_sorted[s]), int(p_sorted[s])
                first_pos, last_pos = int(positions[s]), int(positions[e - 1])
                if t.batch_id is not None:  # rejects a position beyond 2**32 - 1
                    stream_sequence(t.batch_id, last_pos)
                lo, hi = base + first_pos, base + last_pos
                planned_last.setdefault(b, {})[tp] = hi
                span = commit.sequences.get(tp)
                if span is None:
                    commit.sequences[tp] = [lo, hi]
                else:
                    span[0], span[1] = min(span[0], lo), max(span[1], hi)
                # rows at or below the durable highwater were written before
                c = e - s
                skip = max(0, min(c, resume[b].last_sequence.get(tp, -1) - lo + 1))
                commit.skipped += skip
                if skip == c:
                    continue
                idx = pa.array(order[s + skip : e])
                bf = await producers[b].send_batch(
                    cols.values.take(idx),
                    keys=None if cols.keys is None else cols.keys.take(idx),
                    partition=tp,
                    sequence_ids=pa.array(np.arange(lo + skip, hi + 1, dtype=np.int64)),
                )
                pending.append(bf)
                commit.sent += c - skip
                await asyncio.sleep(0)  # let the senders run between groups
                while pending and pending[0].done():
                    _count(pending.popleft(), commit)
            await asyncio.gather(*(p.flush() for p in producers.values()))
            while pending:
                _count(pending.popleft(), commit)
            ok = True
        except errors.ProducerFenced as exc:
            while pending and pending[0].done() and pending[0].exception() is None:
                _count(pending.popleft(), commit)
            raise self._fenced(commit, exc) from exc
        finally:
            await self.close(producers, ok=ok)
            for fut in pending:  # mark failures as seen, so asyncio does not log each one
                if fut.done() and not fut.cancelled():
                    fut.exception()
        log.info(
            "%s: %d rows, %d skipped, %d appended, %d duplicates",
            commit.producer_name,
            commit.rows,
            commit.skipped,
            commit.appended,
            commit.duplicates,
        )
        return commit

    _pending: deque[Any] | None = None  # the running attempt's sent, unprocessed batches
    _commit: PartitionCommit | None = None

    async def acknowledged(self) -> None:
        """Return once at least one batch this attempt sent was answered (appended or
        duplicate), or at once when it has sent nothing; for a hook (fault injection):
        a speculative copy started after this fences an attempt that has acknowledged
        rows, whatever the machine's speed."""
        commit, pending = self._commit, self._pending
        if commit is None or pending is None or commit.appended + commit.duplicates:
            return
        if pending:  # the oldest: answers are counted in the order sent
            await asyncio.wait([pending[0]])


def _count(fut: Any, commit: PartitionCommit) -> None:
    metas = fut.result()  # raises the producer's fatal error, e.g. ProducerFenced
    dup = metas.duplicates
    commit.duplicates += dup
    commit.appended += len(metas) - dup
