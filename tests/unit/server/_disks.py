"""A disk that fills up under ``atomic_file.py`` (the leader-epoch file's writes): the disk is
real; only the ``os`` module seen by ``atomic_file.py`` is swapped for one whose writes fail
for the directories a test names (``disk.full``). The ``disk`` fixture
(conftest.py) installs one for a test."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

from partition_server.epochs import EpochHistory


class FullDisk:
    """``os`` for atomic_file.py: writes to a temporary file under a directory named in
    ``full`` fail with ENOSPC, as on a full disk."""

    def __init__(self) -> None:
        self.full: set[str] = set()
        self.fd_dir: dict[int, str] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def open(self, path: Any, flags: int, mode: int = 0o777) -> int:
        fd = os.open(path, flags, mode)
        self.fd_dir[fd] = Path(path).parent.name
        return fd

    def write(self, fd: int, data: Any) -> int:
        if self.fd_dir.get(fd) in self.full:
            raise OSError(errno.ENOSPC, "No space left on device (test)")
        return os.write(fd, data)


def on_disk(directory: Path) -> list[tuple[int, int]]:
    return EpochHistory.load(directory).entries
