"""A write's attempt (a batch task or a micro-batch's) on the SDK's columnar path: Arrow
batches in, ``send_batch`` calls out, no Python object per row.

``ColumnarAttempt`` is an ``Attempt`` (same producer name, lease, takeover, resume and
fencing; see ``pipeline.attempt``) that takes the Spark partition as Arrow record batches
and, per batch, works on whole columns: the encoder's key and value arrays
(``RecordEncoder.encode_columns``), each row's topic partition (``route``'s rules: the
SDK's key hash ``crc32_keys``, or the Spark partition), its sequence (per topic partition
in row order: ``BatchSequencer``'s 0, 1, 2, ... for a batch write, ``StreamSequencer``'s
``batch_id * 2**32`` + 0, 1, 2, ... for a micro-batch), rows at or below the
takeover's durable highwater skipped (``Resume``), and then one ``send_batch`` per topic
partition with explicit ids. The result is the same ``PartitionCommit`` the row path
gives for the same rows (tests/unit/test_pipeline_columnar.py compares them).

Batch writes and streams both take it; a task that starts its own speculative copy
(``speculate_partition``) takes the row path, which the copy replays from a list.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from pidlease import errors
from pidlease.client.record_columns import crc32_keys
from pipeline.attempt import Attempt, PartitionCommit, takeover_record
from pipeline.encoding import RecordEncoder
from pipeline.sequencing import Resume, Routing, stream_sequence

log = logging.getLogger("pipeline.columnar")


def route_column(
    keys: Any, n: int, *, routing: Routing, spark_partition: int, partitions: int
) -> Any:
    """The topic partition of each of ``n`` rows (numpy int64), as ``sequencing.route``
    gives it row by row."""
    import numpy as np

    fallback = spark_partition % partitions
    if routing is Routing.SPARK or keys is None:
        if routing is Routing.KEY and n:
            raise ValueError("partitioning 'key' needs a key on every row; this row has none")
        return np.full(n, fallback, dtype=np.int64)
    parts = (crc32_keys(keys) % np.uint32(partitions)).astype(np.int64)
    if keys.null_count:
        if routing is Routing.KEY:
            raise ValueError("partitioning 'key' needs a key on every row; this row has none")
        valid = np.asarray(keys.is_valid().to_numpy(zero_copy_only=False))
        parts[~valid] = fallback
    return parts


class ColumnarAttempt(Attempt):
    def run_columns(
        self,
        encoder: RecordEncoder,
        batches: Iterable[Any],
        hooks: Mapping[int, Callable[[], Any]] | None = None,
    ) -> PartitionCommit:
        """Publish the Spark partition's Arrow ``batches``. ``hooks[position]()`` runs just
        before the row at that position (fault injection), as in ``Attempt.run``."""
        it = (b for b in batches if b.num_rows)
        first = next(it, None)
        if first is None:
            t = self.task
            return PartitionCommit(
                t.spark_partition, t.attempt, self.name, t.batch_id, t.speculative
            )

        def all_batches() -> Iterator[Any]:
            yield first
            yield from it

        return asyncio.run(self._run_columns(encoder, all_batches(), hooks or {}))

    async def _run_columns(
        self,
        encoder: RecordEncoder,
        batches: Iterator[Any],
        hooks: Mapping[int, Callable[[], Any]],
    ) -> PartitionCommit:
        import numpy as np
        import pyarrow as pa

        t = self.task
        commit = PartitionCommit(t.spark_partition, t.attempt, self.name, t.batch_id, t.speculative)
        producer = self._open()
        try:
            await producer.start()
        except errors.ProducerFenced as exc:
            await producer.close()
            raise self._fenced(commit, exc) from exc
        if self._on_leased is not None:
            self._on_leased()
        pending: deque[Any] = deque()
        ok = False
        try:
            commit.pid, commit.generation = producer.pid, producer.generation
            partitions = producer.partitions
            resume = Resume({tp: producer.last_sequence_id(tp) for tp in range(partitions)})
            # As Attempt._run: the attempt that fenced an earlier one records it (the loser
            # sends no commit message).
            fenced = takeover_record(t, commit.pid, commit.generation, resume.last_sequence)
            if fenced is not None:
                commit.fenced_attempts.append(fenced)
            next_seq = np.zeros(partitions, dtype=np.int64)  # next position per partition
            # a micro-batch numbers from batch_id * 2**32 (StreamSequencer), a batch from 0
            base = 0 if t.batch_id is None else stream_sequence(t.batch_id, 0)
            position = 0
            hook_at = sorted(hooks)
            for batch in batches:
                for piece, start in _cut(batch, position, hook_at):
                    hook = hooks.get(start)
                    if hook is not None:
                        pause = hook()
                        if inspect.isawaitable(pause):
                            # a stall: awaited on this loop, so the senders go on delivering
                            await pause
                    keys, values = encoder.encode_columns(piece)
                    n = len(values)
                    parts = route_column(
                        keys,
                        n,
                        routing=self.settings.routing,
                        spark_partition=t.spark_partition,
                        partitions=partitions,
                    )
                    commit.rows += n
                    order = np.argsort(parts, kind="stable")
                    counts = np.bincount(parts, minlength=partitions)
                    at = 0
                    for tp in range(partitions):
                        c = int(counts[tp])
                        if not c:
                            continue
                        pos = order[at : at + c]
                        at += c
                        if t.batch_id is not None:  # rejects a position beyond 2**32 - 1
                            stream_sequence(t.batch_id, int(next_seq[tp]) + c - 1)
                        first = base + int(next_seq[tp])
                        next_seq[tp] += c
                        span = commit.sequences.get(tp)
                        if span is None:
                            commit.sequences[tp] = [first, first + c - 1]
                        else:
                            span[1] = first + c - 1
                        # rows at or below the durable highwater were written before
                        skip = max(0, min(c, resume.last_sequence.get(tp, -1) - first + 1))
                        commit.skipped += skip
                        if skip == c:
                            continue
                        idx = pa.array(pos[skip:])
                        bf = await producer.send_batch(
                            values.take(idx),
                            keys=None if keys is None else keys.take(idx),
                            partition=tp,
                            sequence_ids=pa.array(
                                np.arange(first + skip, first + c, dtype=np.int64)
                            ),
                        )
                        pending.append(bf)
                        commit.sent += c - skip
                    position = start + n
                await asyncio.sleep(0)  # let the senders run between Arrow batches
                while pending and pending[0].done():
                    _count(pending.popleft(), commit)
            await producer.flush()
            while pending:
                _count(pending.popleft(), commit)
            ok = True
        except errors.ProducerFenced as exc:
            while pending and pending[0].done() and pending[0].exception() is None:
                _count(pending.popleft(), commit)
            raise self._fenced(commit, exc) from exc
        finally:
            await producer.close(timeout_ms=None if ok else 10_000)
            for fut in pending:  # mark failures as seen, so asyncio does not log each one
                if fut.done() and not fut.cancelled():
                    fut.exception()
        log.info(
            "%s: %d rows, %d skipped, %d appended, %d duplicates",
            self.name,
            commit.rows,
            commit.skipped,
            commit.appended,
            commit.duplicates,
        )
        return commit


def _cut(batch: Any, position: int, hook_at: list[int]) -> Iterator[tuple[Any, int]]:
    """``batch`` (whose first row is at ``position``) in pieces that start at each hook
    position inside it: (piece, position of its first row)."""
    end = position + batch.num_rows
    start = position
    for h in hook_at:
        if start < h < end:
            yield batch.slice(start - position, h - start), start
            start = h
    yield batch.slice(start - position, end - start), start


def _count(fut: Any, commit: PartitionCommit) -> None:
    metas = fut.result()  # raises the producer's fatal error, e.g. ProducerFenced
    dup = metas.duplicates
    commit.duplicates += dup
    commit.appended += len(metas) - dup
