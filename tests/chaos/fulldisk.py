"""What the full-disk tests share: a small tmpfs mounted under a partition server's data
dir (ENOSPC for real; needs root, so the ``tmpfs_cluster`` fixture in ``conftest.py``
skips with the reason elsewhere), and counting a producer's acknowledgements until they
stop coming (the disk is full)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any


def mount(*args: str) -> subprocess.CompletedProcess[str]:
    """``mount`` with ``args`` (e.g. ``-o remount,size=64m PATH`` to grow a tmpfs)."""
    return subprocess.run(["mount", *args], check=False, capture_output=True, text=True, timeout=30)


def umount(path: Path) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        ["umount", str(path)], check=False, capture_output=True, text=True, timeout=30
    )
    if r.returncode != 0:  # still busy a moment after the kill
        time.sleep(1)
        r = subprocess.run(
            ["umount", "-l", str(path)], check=False, capture_output=True, text=True, timeout=30
        )
    return r


def acked_count(futs: Sequence[Future[Any]]) -> int:
    return sum(f.done() and f.exception() is None for f in futs)


def failed_count(futs: Sequence[Future[Any]]) -> int:
    return sum(f.done() and f.exception() is not None for f in futs)


def wait_stalled(
    futs: Sequence[Future[Any]], *, stall_s: float, timeout_s: float, interval_s: float
) -> None:
    """Return once no new acknowledgement came for ``stall_s`` (the disk is full), or after
    ``timeout_s`` whatever happened (the test's asserts say what)."""
    last, since, deadline = -1, time.monotonic(), time.monotonic() + timeout_s
    while time.monotonic() < deadline and time.monotonic() - since < stall_s:
        n = acked_count(futs)
        if n != last:
            last, since = n, time.monotonic()
        time.sleep(interval_s)
