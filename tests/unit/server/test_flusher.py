"""``Flusher`` (partition_server/flusher.py) on its own: real files and real fsyncs, fake
partitions that record the marks they are given, and an executor the test can hold.

What is checked: a flush covers what was written before it began (the mark is taken when
it begins, applied when it ends), writes during a flush go into the next one, one flush
runs at a time, ``interval`` mode waits for the interval and ``batch`` mode does not, many
files are fsynced in lanes, and a failed fsync goes to the error policy without marking
anything durable.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from partition_server.flusher import FSYNC_LANES, FSYNC_PER_LANE_MIN, Flusher, FlushMark


class FakePartition:
    """A partition with ``files`` open files; its mark is (generation, writes so far)."""

    def __init__(self, directory: Path, name: str, files: int = 1) -> None:
        self.fds = [
            os.open(directory / f"{name}-{i}", os.O_CREAT | os.O_WRONLY) for i in range(files)
        ]
        self.writes = 0
        self.prepared: list[FlushMark] = []
        self.done: list[FlushMark] = []

    def write(self, flusher: Flusher) -> None:
        self.writes += 1
        os.write(self.fds[0], b"x")
        flusher.note_write(self)

    def prepare_flush(self) -> tuple[FlushMark, list[int]]:
        mark = (0, self.writes)
        self.prepared.append(mark)
        return mark, list(self.fds)

    def flush_done(self, mark: FlushMark) -> None:
        self.done.append(mark)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


class GateExecutor(Executor):
    """Runs each job on a thread once ``gate`` is set; counts the jobs (lanes)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.jobs = 0
        self._pool = ThreadPoolExecutor(FSYNC_LANES)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.jobs += 1

        def gated() -> Any:
            if not self.gate.wait(5):
                raise TimeoutError("the test never opened the gate")
            return fn(*args, **kwargs)

        return self._pool.submit(gated)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.gate.set()
        self._pool.shutdown(wait, cancel_futures=cancel_futures)


@pytest.fixture
def directory() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 10))


async def until(cond: Callable[[], bool], what: str) -> None:
    for _ in range(1000):
        if cond():
            return
        await asyncio.sleep(0.002)
    raise AssertionError(f"timed out waiting for {what}")


def test_batch_mode_flushes_at_once_and_marks_what_was_written_before(directory: Path) -> None:
    async def main() -> None:
        ex = GateExecutor()
        f = Flusher(mode="batch", interval_ms=10_000, executor=ex)
        a = FakePartition(directory, "a")
        a.write(f)
        a.write(f)
        await until(lambda: ex.jobs == 1, "the flush to begin")
        assert a.prepared == [(0, 2)] and a.done == []
        a.write(f)  # during the fsync: not covered by it, and no second flush at once
        await asyncio.sleep(0.01)
        assert ex.jobs == 1, "one flush at a time"
        ex.gate.set()
        await f.wait_idle()
        assert a.done == [(0, 2), (0, 3)], "the write during the flush got the next one"
        assert f.flushes == 2
        ex.shutdown()
        a.close()

    run(main)


def test_interval_mode_waits_for_the_interval_and_one_flush_covers_every_partition(
    directory: Path,
) -> None:
    async def main() -> None:
        ex = GateExecutor()
        ex.gate.set()
        f = Flusher(mode="interval", interval_ms=80, executor=ex)
        a, b = FakePartition(directory, "a"), FakePartition(directory, "b")
        a.write(f)
        await asyncio.sleep(0.02)
        b.write(f)
        await asyncio.sleep(0.02)
        assert ex.jobs == 0 and a.done == [], "nothing before the interval"
        await until(lambda: bool(a.done and b.done), "the interval's flush")
        assert (a.done, b.done, f.flushes, ex.jobs) == ([(0, 1)], [(0, 1)], 1, 1)
        ex.shutdown()
        a.close()
        b.close()

    run(main)


def test_flush_soon_does_not_wait_for_the_interval(directory: Path) -> None:
    async def main() -> None:
        f = Flusher(mode="interval", interval_ms=60_000)
        a = FakePartition(directory, "a")
        a.write(f)
        await f.wait_idle()  # flushes now (flush_soon), not in a minute
        assert a.done == [(0, 1)]
        await f.wait_idle()  # nothing dirty: returns at once
        assert f.flushes == 1
        a.close()

    run(main)


@pytest.mark.parametrize(
    ("files", "lanes"),
    [
        (1, 1),
        (FSYNC_PER_LANE_MIN * 2 - 1, 1),
        (FSYNC_PER_LANE_MIN * 2, 2),
        (FSYNC_PER_LANE_MIN * FSYNC_LANES * 3, FSYNC_LANES),
    ],
)
def test_many_files_are_fsynced_in_lanes(directory: Path, files: int, lanes: int) -> None:
    async def main() -> None:
        ex = GateExecutor()
        ex.gate.set()
        f = Flusher(mode="batch", interval_ms=0, executor=ex)
        a = FakePartition(directory, "a", files=files)
        a.write(f)
        await f.wait_idle()
        assert (ex.jobs, a.done) == (lanes, [(0, 1)])
        ex.shutdown()
        a.close()

    run(main)


def test_a_failed_fsync_goes_to_the_error_policy_and_marks_nothing(directory: Path) -> None:
    async def main() -> None:
        seen: list[BaseException] = []
        f = Flusher(mode="batch", interval_ms=0, on_error=seen.append)
        a = FakePartition(directory, "a")
        a.write(f)
        os.close(a.fds[0])  # the fsync fails: EBADF
        await until(lambda: bool(seen), "the error policy")
        assert isinstance(seen[0], OSError)
        assert a.done == [], "nothing is marked durable after a failed fsync"
        assert f.flushes == 0

    run(main)


def test_failing_to_take_the_fds_goes_to_the_error_policy_and_leaves_the_flusher_usable(
    directory: Path,
) -> None:
    """Session 25 (issue 24): ``prepare_flush`` raising (EMFILE opening a log's directory,
    at 10,000 partitions) escaped ``Flusher._start`` and left it "running" for good: no
    flush ever again, every flush waiter hanging with the server up. It goes to the error
    policy (production: crash and recover, as for a failed fsync), and the flusher is not
    left running. Before the fix: "timed out waiting for the error policy" (the callback's
    exception went to the loop's handler) and ``_running`` stayed True."""

    async def main() -> None:
        seen: list[BaseException] = []
        f = Flusher(mode="batch", interval_ms=0, on_error=seen.append)
        a = FakePartition(directory, "a")

        def emfile() -> Any:
            raise OSError(24, "Too many open files")

        a.prepare_flush = emfile  # type: ignore[method-assign]
        a.write(f)
        await until(lambda: bool(seen), "the error policy")
        assert isinstance(seen[0], OSError) and seen[0].errno == 24
        assert not f._running
        assert a.done == [] and f.flushes == 0

    run(main)
