"""A follower's cut whose ftruncate or fsync fails (docs/reliability.md, finding 9, found by the
simulation, seed 1426): ``PartitionLog.truncate_to`` raised out of ``Partition.truncate_to`` midway,
with the truncation counted and the file maybe cut but ``flushed_end`` still at the old
end; the fetcher took the OSError for a session error, refetched, and batches fetched
after the cut counted as fsynced below that stale end. A failed fsync or truncate follows
the server's policy for a failed fsync (the flusher's error handler: crash, recover from
what is on disk), and ``flushed_end`` is never left above the log's end. The disk is real;
only the ``os`` module seen by ``log.py`` is swapped for one whose call fails on demand."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path
from typing import Any

import pytest

from partition_server import log as log_module
from partition_server.flusher import Flusher
from partition_server.testing import InlineExecutor, b, open_part, settle, stored


class FailingDisk:
    """``os`` for log.py: the call named in ``failing`` raises EIO."""

    def __init__(self) -> None:
        self.failing = ""

    def __getattr__(self, name: str) -> Any:
        real = getattr(os, name)
        if name != self.failing:
            return real

        def fail(*_args: Any) -> None:
            raise OSError(errno.EIO, f"Input/output error (test {name})")

        return fail


@pytest.mark.parametrize("call", ["fsync", "ftruncate"])
def test_a_failed_cut_calls_the_fsync_error_policy_and_lowers_the_flushed_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    async def go() -> None:
        failures: list[BaseException] = []
        flusher = Flusher(
            mode="batch", interval_ms=0, executor=InlineExecutor(), on_error=failures.append
        )
        part = open_part(tmp_path, flusher)
        part.become_follower(1, 2, "127.0.0.1:1")
        part.append_replicated(stored([b(1, 0, 2), b(1, 2, 2), b(1, 4, 2)]), [(1, 0), (2, 2)])
        fsynced = part.wait_flushed(6)
        await settle()
        assert fsynced.done() and part.flushed_end == 6
        disk = FailingDisk()
        monkeypatch.setattr(log_module, "os", disk)
        disk.failing = call
        with pytest.raises(OSError, match=f"test {call}"):  # the injected failure, unwrapped
            part.truncate_to(3)  # the batch holding 3 starts at 2: the log ends at 2
        assert part.flushed_end <= 2, f"flushed_end {part.flushed_end} above the cut at 2"
        assert part.high_watermark <= 2
        assert len(failures) == 1, "a failed fsync or truncate in a cut did not stop the server"
        monkeypatch.setattr(log_module, "os", os)
        part.close()

    asyncio.run(go())
