"""Replace a small file atomically and durably: write a temporary file, fsync it, rename it
over the target, fsync the directory. A crash leaves either the old or the new file, never
a mix; snapshots, the leader-epoch history and the high-watermark checkpoint all use it."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: Path, data: bytes, tmp_suffix: str = ".tmp") -> None:
    """Blocking (two fsyncs): run it in an executor from the event loop. ``tmp_suffix``:
    the temporary file's, for a writer that may run beside the usual one (each renames
    only a file it wrote whole)."""
    tmp = path.with_suffix(tmp_suffix)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        written = 0
        while written < len(data):  # os.write may write less than asked
            written += os.write(fd, view[written:])
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
