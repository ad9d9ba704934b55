"""The simulated disk: real files (in a temp dir, tmpfs when there is one) behind a shim
of the ``os`` module that the log, the flusher, the log manager and atomic_file use.

The shim delegates to the real ``os`` and adds what a real disk does to a server:
``write`` may fail with ENOSPC (a full disk, for a while) or EIO, ``fsync`` may fail
(the flusher's error handler then crashes the server, as in production) and takes a
seed-chosen time (it runs in the simulated executor). It also remembers, per file, how
many bytes the last fsync covered: a crash cuts every file of the dead node back to that
length plus a random part of the unsynced tail (a torn write), which is what a machine
that loses power leaves behind."""

from __future__ import annotations

import contextlib
import errno
import os as _os
import random
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

from tests.sim.loop import NODE, Node


@dataclass
class DiskFaults:
    enospc_from: float = -1.0  # virtual seconds; writes fail in [from, until) ...
    enospc_until: float = -1.0
    enospc_p: float = 0.0  # ... with this probability each
    eio_write_p: float = 0.0  # any write, any time
    fsync_fail_p: float = 0.0  # any fsync of a log segment


class DiskShim:
    """Stands in for the ``os`` module of the patched server modules."""

    def __init__(self, rng: random.Random, now: Any, faults: DiskFaults, trace: Any) -> None:
        self._rng = rng
        self._now = now
        self.faults = faults
        self._trace = trace
        self.fd_path: dict[int, str] = {}
        self.fd_node: dict[int, Node | None] = {}
        self.synced: dict[str, int] = {}  # path -> bytes known on the platter
        self.injected = 0
        self.fsyncs = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(_os, name)

    # -- files ---------------------------------------------------------------------------
    def open(self, path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        p = _os.path.abspath(_os.fspath(path))
        new = bool(flags & _os.O_CREAT) and not _os.path.exists(p)
        fd = _os.open(path, flags, mode, **kw)
        self.fd_path[fd] = p
        self.fd_node[fd] = NODE.get()
        if new or flags & _os.O_TRUNC:
            # A new file (perhaps where an unlinked one was: retention, a cut) has nothing
            # on the platter yet.
            self.synced[p] = 0
        return fd

    def close(self, fd: int) -> None:
        self.fd_path.pop(fd, None)
        self.fd_node.pop(fd, None)
        _os.close(fd)

    def write(self, fd: int, data: Any) -> int:
        f = self.faults
        now = self._now()
        if f.enospc_from <= now < f.enospc_until and self._rng.random() < f.enospc_p:
            self.injected += 1
            self._trace("disk", f"ENOSPC on write to {self._name(fd)}")
            raise OSError(errno.ENOSPC, "No space left on device (sim)")
        if f.eio_write_p and self._rng.random() < f.eio_write_p:
            self.injected += 1
            self._trace("disk", f"EIO on write to {self._name(fd)}")
            raise OSError(errno.EIO, "Input/output error (sim)")
        return _os.write(fd, data)

    def fsync(self, fd: int) -> None:
        p = self.fd_path.get(fd)
        if (
            p is not None
            and p.endswith(".log")
            and self.faults.fsync_fail_p
            and self._rng.random() < self.faults.fsync_fail_p
        ):
            self.injected += 1
            self._trace("disk", f"fsync of {self._name(fd)} fails (EIO)")
            raise OSError(errno.EIO, "Input/output error (sim fsync)")
        _os.fsync(fd)
        self.fsyncs += 1
        if p is not None and not _os.path.isdir(p):
            self.synced[p] = _os.fstat(fd).st_size

    def ftruncate(self, fd: int, length: int) -> None:
        _os.ftruncate(fd, length)
        p = self.fd_path.get(fd)
        if p is not None and self.synced.get(p, 0) > length:
            self.synced[p] = length  # metadata changes are journaled: the cut sticks

    def rename(self, src: Any, dst: Any) -> None:
        _os.rename(src, dst)
        s, d = _os.path.abspath(_os.fspath(src)), _os.path.abspath(_os.fspath(dst))
        self.synced[d] = self.synced.pop(s, 0)

    def close_all(self) -> None:
        for fd in list(self.fd_path):
            with contextlib.suppress(OSError):
                self.close(fd)

    def _exit(self, code: int) -> None:  # the flusher's default error handler: never here
        raise AssertionError(f"os._exit({code}) reached the simulation")

    def _name(self, fd: int) -> str:
        p = self.fd_path.get(fd, f"fd {fd}")
        return "/".join(p.split("/")[-2:])

    # -- crashes -------------------------------------------------------------------------
    def crash(self, node: Node, data_dir: str) -> list[str]:
        """Close the node's fds and cut its files to what was fsynced + a torn tail."""
        for fd in [fd for fd, n in self.fd_node.items() if n is node]:
            self.close(fd)
        notes = []
        for root, _dirs, files in sorted(_os.walk(data_dir)):
            for name in sorted(files):
                p = _os.path.join(root, name)
                size = _os.path.getsize(p)
                synced = min(self.synced.get(p, 0), size)
                if synced >= size:
                    continue
                r = self._rng.random()
                keep = synced if r < 0.4 else size if r < 0.6 else self._rng.randint(synced, size)
                if keep < size:
                    _os.truncate(p, keep)
                    notes.append(f"{'/'.join(p.split('/')[-2:])}: {size}->{keep} (synced {synced})")
                self.synced[p] = keep
        notes += self._rot_indexes(data_dir)
        return notes

    def _rot_indexes(self, data_dir: str) -> list[str]:
        """Index faults: a segment's index files are never fsynced (the crash above tears
        them like any unsynced file); beyond that, now and then one byte of a surviving
        index file is flipped (a misdirected write, bit rot). Its checksum must send the
        open to a rebuild from the segment, never to wrong offsets."""
        notes = []
        for root, _dirs, files in sorted(_os.walk(data_dir)):
            for name in sorted(files):
                if not name.endswith((".index", ".timeindex")) or self._rng.random() >= 0.05:
                    continue
                p = _os.path.join(root, name)
                size = _os.path.getsize(p)
                if size == 0:
                    continue
                at = self._rng.randrange(size)
                with open(p, "r+b") as f:
                    f.seek(at)
                    byte = f.read(1)
                    f.seek(at)
                    f.write(bytes([byte[0] ^ (1 << self._rng.randrange(8))]))
                notes.append(f"{'/'.join(p.split('/')[-2:])}: byte {at} flipped")
        return notes

    def fsynced_end(self, plog: Any) -> int:
        """The log offset below which every batch of ``plog`` is on the platter."""
        end = plog.log_start_offset  # retention deleted what is below, all fsynced
        segs = plog.segments
        for si, seg in enumerate(segs):
            if seg.size == 0:
                continue
            synced = self.synced.get(_os.path.abspath(str(seg.path)), 0)
            if seg.size <= synced:
                end = segs[si + 1].base_offset if si + 1 < len(segs) else plog.next_offset
                continue
            # batch i is whole on the platter iff the next one starts at or before ``synced``
            batches = plog.batches(seg)  # the log keeps a sparse index only: read them
            full = bisect_right([pos for _, pos in batches], synced) - 1
            return batches[full][0] if full > 0 else end
        return end
