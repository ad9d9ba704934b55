"""The leader-epoch history of one replicated partition: which leader epoch wrote which
range of the log, and how many times the log was cut back.

A batch does not carry its leader epoch (the batch format is fixed and the producer's
checksum covers it), so each replica keeps ``(epoch, start_offset)`` entries, as Kafka's
leader-epoch checkpoint does: epoch ``e`` wrote the offsets from its start up to the next
entry's start (or the log end). A new leader adds ``(its epoch, its log end)`` before it
accepts a write; a follower adds the entries the leader sends with fetched batches.

Within one epoch only one leader ever wrote, so two replicas agree on every offset of an
epoch that both hold. That is what lets a returning follower find where its log diverges
from the leader's: it asks the leader where its own latest epoch ends (EPOCH_END), and
:func:`truncation_step` turns the answer into a truncation point (repeated while the
leader does not know the follower's epoch at all).

``truncations`` counts the times the log was cut back; snapshots record it, so rows
captured before a cut are never trusted after it (``snapshot.py``).

File ``<partition dir>/leader-epochs``, text, replaced atomically (tmp, fsync, rename,
fsync dir)::

    pidlease-epochs 1 <crc32 of the lines below, hex>
    truncations <n>
    <epoch> <start offset>        (one line per entry, epochs and starts increasing)
"""

from __future__ import annotations

import logging
import zlib
from bisect import bisect_right
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from partition_server.atomic_file import write_atomically
from pidlease.errors import describe

log = logging.getLogger("partition_server.epochs")

FILE_NAME = "leader-epochs"
_HEADER = "pidlease-epochs 1"


class EpochHistory:
    """Pure bookkeeping plus :meth:`load` / :meth:`save` for its file."""

    def __init__(
        self,
        entries: list[tuple[int, int]] | None = None,
        truncations: int = 0,
        path: Path | None = None,
    ) -> None:
        self.entries: list[tuple[int, int]] = list(entries or [])
        self.truncations = truncations
        self.path = path
        self.found = True  # False: there was no file (load)
        # The bytes this process last wrote to the file, or None when unknown: ``save``
        # skips a write of the same bytes (``prepare`` / ``prewrite``: many new leaderships
        # write their files in parallel, off the event loop, before they are taken).
        self.on_disk: bytes | None = None
        self.saves = 0

    # -- queries ---------------------------------------------------------------------------
    @property
    def latest_epoch(self) -> int | None:
        return self.entries[-1][0] if self.entries else None

    def _index_at_or_below(self, epoch: int) -> int:
        """Index of the last entry whose epoch is <= ``epoch``, -1 when none is."""
        return bisect_right([e for e, _ in self.entries], epoch) - 1

    def end_offset_for(self, epoch: int, log_end: int) -> tuple[int, int]:
        """The leader's answer to EPOCH_END: (the largest epoch <= ``epoch`` it knows,
        the offset where that epoch ends), or (-1, -1) when it knows no such epoch."""
        i = self._index_at_or_below(epoch)
        if i < 0:
            return -1, -1
        end = self.entries[i + 1][1] if i + 1 < len(self.entries) else log_end
        return self.entries[i][0], end

    def start_after(self, epoch: int) -> int | None:
        """Start offset of the first entry with an epoch greater than ``epoch``."""
        i = self._index_at_or_below(epoch) + 1
        return self.entries[i][1] if i < len(self.entries) else None

    def has_epoch(self, epoch: int) -> bool:
        i = self._index_at_or_below(epoch)
        return i >= 0 and self.entries[i][0] == epoch

    def entries_from(self, offset: int) -> list[tuple[int, int]]:
        """The entries a fetch from ``offset`` may need: the one holding ``offset`` and
        every later one."""
        starts = [s for _, s in self.entries]
        i = max(bisect_right(starts, offset) - 1, 0)
        return self.entries[i:]

    # -- changes (the caller saves, through :meth:`change`) ---------------------------------
    @contextmanager
    def change(self) -> Iterator[None]:
        """Changes made in the block are saved at its end, when there are any. If the block
        or the save raises (a full disk), the history in memory is put back as it was: an
        entry kept in memory but not in the file would make the retry see nothing new and
        never save it, and after a restart the file would lack that epoch."""
        entries, truncations = list(self.entries), self.truncations
        try:
            yield
            if (self.entries, self.truncations) != (entries, truncations):
                self.save()
        except BaseException:
            self.entries, self.truncations = entries, truncations
            raise

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` writes from ``start_offset`` on. True when that is new.
        Refuses to go backwards: epochs and start offsets only grow."""
        if self.entries:
            last_epoch, last_start = self.entries[-1]
            if epoch <= last_epoch:
                if epoch < last_epoch:
                    raise ValueError(f"epoch {epoch} is older than the latest {last_epoch}")
                return False
            if start_offset < last_start:
                raise ValueError(
                    f"epoch {epoch} would start at {start_offset}, before epoch "
                    f"{last_epoch}'s start {last_start}"
                )
            if start_offset == last_start:
                # The previous epoch wrote nothing: it owns no offsets, drop it.
                self.entries.pop()
        self.entries.append((epoch, start_offset))
        return True

    def truncate_to(self, offset: int) -> None:
        """The log now ends at ``offset``: drop the entries that start at or after it."""
        while self.entries and self.entries[-1][1] >= offset:
            self.entries.pop()

    def trim_past(self, log_end: int) -> None:
        """At open: entries starting beyond the log end describe nothing that is there."""
        while self.entries and self.entries[-1][1] > log_end:
            self.entries.pop()

    # -- the file --------------------------------------------------------------------------
    @classmethod
    def load(cls, directory: Path) -> EpochHistory:
        """Read ``<directory>/leader-epochs`` (call :meth:`settle` once the log is open).
        Unreadable: ``[(0, 0)]`` and a truncation count no snapshot has, so the next
        leader's answer cuts this log back to what it knows for sure and snapshot rows are
        not trusted."""
        path = directory / FILE_NAME
        try:
            text = path.read_text()
        except FileNotFoundError:
            hist = cls([], 0, path)
            hist.found = False
            return hist
        try:
            head, _, body = text.partition("\n")
            magic, crc = head.rsplit(" ", 1)
            if magic != _HEADER or int(crc, 16) != zlib.crc32(body.encode()):
                raise ValueError("bad header or checksum")
            lines = body.splitlines()
            tag, n = lines[0].split()
            if tag != "truncations":
                raise ValueError("no truncation count")
            hist = cls([], int(n), path)
            for a, b in (ln.split() for ln in lines[1:]):
                hist.assign(int(a), int(b))
        except (ValueError, IndexError) as exc:
            log.error(
                "%s is unreadable (%s); assuming epoch 0 for the whole log", path, describe(exc)
            )
            return cls([(0, 0)], 1 << 32, path)
        return hist

    def settle(self, log_end: int) -> None:
        """Fit the history to the opened log: a log with records and no file was written
        before replication, by epoch 0; entries past the log end describe nothing."""
        if not self.found and not self.entries and log_end > 0:
            self.entries = [(0, 0)]
        self.trim_past(log_end)

    def encode(self) -> bytes:
        body = f"truncations {self.truncations}\n" + "".join(f"{e} {s}\n" for e, s in self.entries)
        return f"{_HEADER} {zlib.crc32(body.encode()):08x}\n{body}".encode()

    def save(self) -> None:
        """Replace the file atomically and durably (blocking: a few hundred bytes), unless
        it already holds these bytes (written by :meth:`prewrite`)."""
        assert self.path is not None
        data = self.encode()
        if data == self.on_disk:
            return
        write_atomically(self.path, data)
        self.on_disk = data
        self.saves += 1

    # -- a new leadership's entry written ahead (issue 24: many at once) -------------------
    def token(self) -> tuple[tuple[tuple[int, int], ...], int, int]:
        """What the history is now, saves included: unchanged between two calls means no
        entry moved and no file was written meanwhile."""
        return tuple(self.entries), self.truncations, self.saves

    def prepare(self, epoch: int, start_offset: int) -> bytes | None:
        """The file's bytes after ``assign(epoch, start_offset)``, changing nothing; None
        when that assign would change nothing or is refused."""
        copy = EpochHistory(self.entries, self.truncations)
        try:
            if not copy.assign(epoch, start_offset):
                return None
        except ValueError:
            return None
        return copy.encode()

    def prewrite(self, data: bytes) -> None:
        """Blocking, in an executor: write ``data`` (from :meth:`prepare`) to the file, under
        its own temporary name. The caller, back on the loop, then takes the leadership
        (whose ``save`` finds the bytes there: ``on_disk``) or, when anything changed
        meanwhile or the leadership was not taken, saves the history again."""
        assert self.path is not None
        write_atomically(self.path, data, tmp_suffix=".pre.tmp")

    def __repr__(self) -> str:
        return f"EpochHistory({self.entries}, truncations={self.truncations})"


def truncation_step(
    history: EpochHistory, log_end: int, asked_epoch: int, leader_epoch: int, leader_end: int
) -> tuple[int, bool]:
    """One round of finding where a follower's log diverges from the leader's.

    The follower asked about ``asked_epoch`` (its latest) and the leader answered with
    (``leader_epoch``, ``leader_end``) from :meth:`EpochHistory.end_offset_for`. Returns
    (offset to truncate the follower's log to, whether that is final). Not final means the
    follower holds epochs the leader never had: it cuts them off and asks again about the
    epoch it then ends with (each round drops at least one entry, so rounds are bounded).
    """
    if leader_epoch < 0:
        return 0, True  # the leader has no epoch this old: nothing in common
    if leader_epoch == asked_epoch:
        return min(leader_end, log_end), True
    if leader_epoch > asked_epoch:
        raise ValueError(f"leader answered epoch {leader_epoch} for {asked_epoch}")
    cut = history.start_after(leader_epoch)
    cut = log_end if cut is None else min(cut, log_end)
    if history.has_epoch(leader_epoch):
        # Both hold epoch leader_epoch; it agrees up to where the shorter one ends it.
        return min(cut, leader_end), True
    return cut, False
