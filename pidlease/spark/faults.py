"""Injected faults, so tests and demos can show exactly-once under the failures Spark
really has. Each is off unless its option is set (``pidlease.spark.options.Faults``).

- ``fail_after_rows_once=N``: attempt 0 of a batch-write task (of ``fail_partitions``,
  default all) raises ``InjectedFailure`` just before its row N, after handing rows
  0..N-1 to the producer. Run Spark with ``local[n,F]`` (F > 1) so it retries the task;
  the retry takes the producer over and resumes after what is durable.
- ``speculate_partition=K`` (``speculate_after_rows=N``, default half the rows): Spark
  starts no speculative tasks in local mode, so attempt 0 of Spark partition K starts its
  own speculative copy when it reaches row N and has an answer for one of the batches it
  sent (so it has acknowledged rows to be fenced with, however slow the machine): a
  second ``Attempt`` of the same partition, on the same rows, with its own producer and
  connections, on a thread beside the first.
  The copy's lease is a takeover, so the original is fenced at its next append; it stops
  cleanly and the copy finishes the partition. The task reports the copy's result, with
  the fenced attempt's figures in ``fenced_attempts`` (as Spark keeps the result of
  whichever copy of a task succeeds).
- ``kill_batch_id=B`` (``kill_at_row=R``): in streaming micro-batch B every attempt of
  every task raises before row R, so Spark gives the batch up and the query dies
  mid-batch. Restarting the query without the option replays batch B from the checkpoint.
- ``kill_commit_batch_id=B``: the driver-side commit of micro-batch B raises after every
  row of it was written, so the checkpoint never records B: the restart replays B whole.
- ``stall_partition=K`` (``stall_at_row=R``, ``stall_ms=S``, ``stall_marker=FILE``):
  attempt 0 of a batch task of Spark partition K stops before row R for S ms (what it
  sent is delivered meanwhile), after appending ``<os pid> <partition>`` to FILE.
  On a real cluster that is a straggler: Spark's own speculation starts a copy on another
  host, or a test SIGKILLs the executor named by the marker while the task is mid-write.
  With a marker it stalls once per partition (a resubmitted stage's attempt 0 does not).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

from pidlease.spark.attempt import PartitionCommit, TaskInfo
from pidlease.spark.columnar import ColumnarAttempt
from pidlease.spark.encoding import RecordEncoder
from pidlease.spark.errors import AttemptFenced, InjectedFailure, PipelineError
from pidlease.spark.options import Faults, WriteSettings

TWIN_LEASE_TIMEOUT_S = 60.0  # the speculative copy must have leased by then
TWIN_FINISH_TIMEOUT_S = 600.0  # and finished by then


def _raiser(message: str) -> Callable[[], None]:
    def hook() -> None:
        raise InjectedFailure(message)

    return hook


def _staller(faults: Faults, task: TaskInfo) -> Callable[[], Any]:
    def hook() -> Any:
        if faults.stall_marker:
            # Once per partition: after an executor is lost, Spark may resubmit the write
            # stage (its shuffle input was on that executor), and the new stage's task is
            # attempt 0 again; it must not stall (and be killed) once more.
            with (
                contextlib.suppress(FileNotFoundError),
                open(faults.stall_marker, encoding="utf-8") as f,
            ):
                if any(line.split()[1:] == [str(task.spark_partition)] for line in f):
                    return None
            with open(faults.stall_marker, "a", encoding="utf-8") as f:
                f.write(f"{os.getpid()} {task.spark_partition}\n")
        # Awaited by the attempt: its producer delivers what was sent and renews the
        # lease meanwhile, as a slow but live task would.
        return asyncio.sleep(faults.stall_s)

    return hook


def hooks_for(faults: Faults, task: TaskInfo) -> dict[int, Callable[[], Any]]:
    """The failure hooks (row position -> callable) this task must run."""
    hooks: dict[int, Callable[[], Any]] = {}
    n = faults.fail_after_rows_once
    if (
        n is not None
        and task.batch_id is None
        and task.attempt == 0
        and not task.speculative
        and (faults.fail_partitions is None or task.spark_partition in faults.fail_partitions)
    ):
        hooks[n] = _raiser(
            f"injected failure of attempt 0 of Spark partition {task.spark_partition} "
            f"after {n} rows (fail_after_rows_once)"
        )
    if (
        faults.stall_partition == task.spark_partition
        and task.batch_id is None
        and task.attempt == 0
        and not task.speculative
    ):
        hooks[faults.stall_at_row] = _staller(faults, task)
    if task.batch_id is not None and faults.kill_batch_id == task.batch_id:
        hooks[faults.kill_at_row] = _raiser(
            f"injected kill of micro-batch {task.batch_id} at row {faults.kill_at_row} of Spark "
            f"partition {task.spark_partition} (kill_batch_id)"
        )
    return hooks


def wants_twin(faults: Faults, task: TaskInfo) -> bool:
    return (
        faults.speculate_partition == task.spark_partition
        and task.attempt == 0
        and not task.speculative
    )


def run_task(
    settings: WriteSettings, task: TaskInfo, encoder: RecordEncoder, batches: Iterable[Any]
) -> PartitionCommit:
    """What a writer task runs: one attempt, with the faults the options ask for."""
    if wants_twin(settings.faults, task):
        return run_with_twin(settings, task, encoder, list(batches))
    return ColumnarAttempt(settings, task).run_columns(
        encoder, batches, hooks_for(settings.faults, task)
    )


def run_with_twin(
    settings: WriteSettings, task: TaskInfo, encoder: RecordEncoder, batches: list[Any]
) -> PartitionCommit:
    """Attempt ``task`` with a speculative copy started beside it (see the module doc)."""
    rows = sum(b.num_rows for b in batches)
    start_at = settings.faults.speculate_after_rows
    if start_at is None:
        start_at = rows // 2
    if not 0 <= start_at < rows:
        # Nothing left to overlap: a copy started at the end fences nobody.
        return ColumnarAttempt(settings, task).run_columns(
            encoder, batches, hooks_for(settings.faults, task)
        )
    twin_task = dataclasses.replace(task, attempt=task.attempt + 1, speculative=True)
    leased = threading.Event()
    outcome: dict[str, Any] = {}

    def twin_main() -> None:
        try:
            outcome["commit"] = ColumnarAttempt(
                settings, twin_task, on_leased=leased.set
            ).run_columns(encoder, batches)
        except BaseException as exc:  # noqa: BLE001 - reported by the original's thread
            outcome["error"] = exc
        finally:
            leased.set()

    thread = threading.Thread(
        target=twin_main, daemon=True, name=f"pidlease-speculative-{task.spark_partition}"
    )

    attempt = ColumnarAttempt(settings, task)

    async def launch() -> None:
        # Start the copy only once the original has an answer for one of its batches: a
        # copy started while everything the original sent is still in flight (a slow
        # machine) fences it before it acknowledged anything, and the test of a fenced
        # original's acknowledged rows tests nothing.
        await attempt.acknowledged()
        thread.start()
        # Go on only once the copy holds the newer generation, so the two really overlap
        # (waited off the loop: the original's batches in flight go on being answered).
        if not await asyncio.to_thread(leased.wait, TWIN_LEASE_TIMEOUT_S):
            raise PipelineError(
                f"the speculative copy did not lease within {TWIN_LEASE_TIMEOUT_S}s"
            )

    hooks = hooks_for(settings.faults, task)
    hooks[start_at] = launch
    original: PartitionCommit | None = None
    original_fenced: AttemptFenced | None = None
    try:
        # A fenced original waits for the copy's rows and ends as a no-op (fenced=True).
        original = attempt.run_columns(encoder, batches, hooks)
    except AttemptFenced as exc:
        original_fenced = exc
    finally:
        if thread.is_alive() or thread.ident is not None:
            thread.join(TWIN_FINISH_TIMEOUT_S)
    if thread.is_alive():
        raise PipelineError(f"the speculative copy did not finish within {TWIN_FINISH_TIMEOUT_S}s")
    twin: PartitionCommit | None = outcome.get("commit")
    twin_error: BaseException | None = outcome.get("error")
    if twin is not None and not twin.fenced and (original is None or original.fenced):
        # The copy's takeover already noted the original (by its generation); the
        # original's own figures say more, so they take that entry's place.
        figures = original.figures() if original is not None else {}
        if original_fenced is not None:
            figures = original_fenced.figures
        if figures:
            twin.fenced_attempts = [
                f for f in twin.fenced_attempts if f.get("generation") != figures.get("generation")
            ] + [figures]
        return twin
    if original is not None and not original.fenced and twin is not None and twin.fenced:
        original.fenced_attempts.append(twin.figures())
        return original
    if original is not None and isinstance(twin_error, AttemptFenced):
        original.fenced_attempts.append(twin_error.figures)
        return original
    if twin_error is not None:
        raise twin_error
    if original_fenced is not None:
        raise original_fenced
    # Both succeeded: possible only when the rows after the start were already written
    # (a re-run), so the original had nothing left to send and nothing to be fenced on.
    assert original is not None
    return original
