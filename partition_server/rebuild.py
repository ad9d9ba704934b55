"""Every path that rebuilds a partition's producer state, in one place (the table of
them is in docs/log.md, "Producer state outlives the segments that carried it"):

- ``recover``: at startup, the newest trusted image (the server's snapshot or this
  partition's start-over file) and a replay of the log from its ``replay_from``; from the
  log start when no image is trusted, then ``restore_deleted_only``;
- ``rows_kept_through_cut`` and ``rebuild_from_log``: a follower's cut (``truncate_to``);
- ``rows_below_log_start`` and ``start_over``: a follower whose log ends below its leader's
  log start drops its log and adopts the leader's rows as of that start (``row_below``),
  then replays the leader's log from there (``restart_at``);
- ``replay_batch``: one stored batch, as replay and the rebuilds apply it.

Partition keeps thin calls to these (the sim wraps ``Partition.restart_at``). The rules
they apply are pure and live in ``producer_state.py``: a FENCE is not a data batch
(``pids_with_data``), cut batches take their sequences with them and a PID whose kept
batches all went falls back to its durable highwater (``cut_row``), adopted and restored
rows never lower a generation (``adopt_rows``).

What each path trusts:

- the log, for every PID with a data batch in it;
- for the others (their data batches are all below the log start, deleted by retention,
  or in a cut range): an image of the state, never a fence alone. A snapshot's rows are
  trusted when the partition's truncation count (``epochs.py``) is the one they were
  captured at; after a cut they only bring back PIDs with no data batch left, rewound by
  ``cut_row`` with the durable highwaters the image recorded;
- a start-over's adopted rows are durable before the log is dropped: written to
  ``start-over.snap`` in the partition's directory (the snapshot format, one partition)
  at the truncation count the start-over then saves, so older snapshots, captured at the
  count before it, are no longer trusted. A crash at any point leaves either the old log
  with a trusted older snapshot (the follower starts over again at its next fetch) or the
  start-over image trusted. The log manager removes the file once a server snapshot holds the
  partition (``Partition.start_over_file``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from partition_server.atomic_file import write_atomically
from partition_server.epochs import EpochHistory
from partition_server.log import OpenReport, PartitionLog
from partition_server.producer_state import (
    ProducerStateTable,
    Row,
    adopt_rows,
    cut_row,
    pids_with_data,
    row_below,
)
from partition_server.snapshot import CorruptSnapshot, PartitionImage, Snapshot
from partition_server.snapshot import decode as decode_snapshot
from partition_server.snapshot import encode as encode_snapshot
from pidlease.errors import describe
from pidlease.wire.protocol import BatchHeader

log = logging.getLogger("partition_server.rebuild")

START_OVER_FILE = "start-over.snap"

OpenLog = Callable[[int, Callable[[BatchHeader], None]], tuple[PartitionLog, OpenReport]]


def replay_batch(state: ProducerStateTable, h: BatchHeader, now_ms: int) -> None:
    """Replay one stored batch into ``state`` (the log is the truth: no checks)."""
    if h.is_control:
        state.apply_fence(h.pid, h.generation, now_ms)
    else:
        state.apply_append(
            h.pid, h.generation, h.base_sequence, h.count, h.base_offset, now_ms, durable=True
        )


# -- startup --------------------------------------------------------------------------------
def read_start_over(directory: Path, name: str) -> PartitionImage | None:
    """The image a start-over left in ``directory`` (None when there is none, or it is
    damaged: then it was never renamed into place whole, and the start-over never went on:
    the truncation count it would have been trusted at was saved after it)."""
    (directory / START_OVER_FILE).with_suffix(".tmp").unlink(missing_ok=True)
    path = directory / START_OVER_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("%s: start-over state %s unreadable (%s)", name, path, describe(exc))
        return None
    try:
        snap = decode_snapshot(raw)
    except CorruptSnapshot as exc:
        log.warning("%s: start-over state %s unusable (%s)", name, path, describe(exc))
        return None
    return next(iter(snap.partitions.values()), None)


def recover(
    directory: Path,
    name: str,
    state: ProducerStateTable,
    epochs: EpochHistory,
    snapshot: PartitionImage | None,
    open_log: OpenLog,
    now_ms: int,
    checkpoint_hw: int | None,
) -> tuple[PartitionLog, OpenReport, int, int | None, bool]:
    """Open the log (``open_log(replay_from, on_batch)``) and rebuild ``state``: the newest
    trusted image's rows + replay of the log from its ``replay_from``; from 0 when no
    image is trusted (the log was cut since) or the log ends before what it covered, then
    the PIDs only an image knows (``restore_deleted_only``). ``checkpoint_hw``
    (replicated partitions only; None otherwise) caps what counts as durable. Returns (log,
    report, batches replayed, the high watermark to start from, whether a start-over
    file is there)."""
    start_over = read_start_over(directory, name)
    images = [i for i in (snapshot, start_over) if i is not None]
    for img in images:
        # Valid even when the rows are not trusted below: what was dropped stays dropped.
        state.note_dropped(img.dropped_last_use_max_ms)
    trusted = [i for i in images if i.truncations == epochs.truncations]
    image = max(trusted, key=lambda i: i.covered_to) if trusted else None
    distrusted: PartitionImage | None = None  # its rows still hold deleted segments'
    if image is None and images:
        log.warning(
            "%s: the log was cut back since the snapshot; rebuilding producer state from offset 0",
            name,
        )
        distrusted = max(images, key=lambda i: (i.truncations, i.covered_to))
    from_offset = covered_to = 0
    if image is not None:
        from_offset, covered_to = image.replay_from, image.covered_to
        state.load_rows(image.rows)
        if image is start_over:
            log.info(
                "%s: producer state from the start-over at offset %d (%d PIDs)",
                name,
                image.replay_from,
                len(image.rows),
            )
    replayed = 0

    def replay(h: BatchHeader) -> None:
        nonlocal replayed
        replayed += 1
        replay_batch(state, h, now_ms)

    plog, report = open_log(from_offset, replay)
    if plog.log_start_offset > from_offset and distrusted is None:
        # Retention deletes only below the newest snapshot's replay_from, so this is a
        # missing or older snapshot: PIDs only the deleted segments held are not known.
        log.warning(
            "%s: the log starts at %d, above the snapshot's replay offset %d; producer "
            "state of the deleted segments is not recovered",
            name,
            plog.log_start_offset,
            from_offset,
        )
    if plog.next_offset < covered_to:
        log.warning(
            "%s: log ends at %d, before the snapshot's offset %d; rebuilding producer state "
            "from offset 0",
            name,
            plog.next_offset,
            covered_to,
        )
        state.clear()
        replayed = 0
        for h in plog.iter_headers(0):
            replay(h)
        distrusted = image
    if distrusted is not None and plog.log_start_offset > 0:
        restore_deleted_only(state, distrusted, plog, name)
    epochs.settle(plog.next_offset)
    if checkpoint_hw is not None:
        # Retention deleted only below the high watermark of its time, so the log start
        # is committed even when the checkpoint lags behind it.
        checkpoint_hw = min(max(checkpoint_hw, plog.log_start_offset), plog.next_offset)
        # Batches above the last known high watermark may not be on the in-sync
        # replicas: in flight again, never DUPLICATE, until the high watermark passes.
        for h in plog.iter_headers(checkpoint_hw):
            if not h.is_control and h.base_offset + h.count > checkpoint_hw:
                state.mark_pending(h.pid, h.base_sequence, h.last_sequence, h.last_offset)
    return plog, report, replayed, checkpoint_hw, start_over is not None


def restore_deleted_only(
    state: ProducerStateTable, image: PartitionImage, plog: PartitionLog, name: str
) -> None:
    """After a rebuild from the log start (the image not trusted: the log was cut since,
    or ends before what it covered), bring back from that image the PIDs with no data
    batch left in the log: retention deleted their batches (below the log start, never
    cut since: a cut is above the high watermark, deletion below it, and deletion after a
    cut waits for a newer snapshot). A fence in the log is no such batch: its generation
    stays, the row brings the highwater. The rows are rewound to the log start
    (``cut_row``): anything newer the image saw was cut. A PID with nothing committed
    there is not brought back."""
    start = plog.log_start_offset
    in_log = pids_with_data(plog.iter_headers(0), plog.next_offset)
    back: list[Row] = []
    for row in image.rows:
        pid = row[0]
        if pid in in_log:
            continue
        kept = cut_row(row, start, image.durable_highwater(pid, row[2]))
        if kept is not None:
            back.append(kept)
    if back:
        state.load_rows(adopt_rows(state.export_rows(), back))
    log.warning(
        "%s: %d producer(s) whose batches retention deleted restored from the snapshot",
        name,
        len(back),
    )


# -- a follower's cut ------------------------------------------------------------------------
def rows_kept_through_cut(state: ProducerStateTable, plog: PartitionLog, end: int) -> list[Row]:
    """Rows, as of the cut at ``end``, of the PIDs with no data batch left in the log below
    it: their state came from segments retention deleted (all committed) and maybe from
    batches in the cut range, so a rebuild from the log start cannot restore it (nor from
    a fence: ``pids_with_data``). Rewound by ``cut_row`` with their durable (committed)
    highwater: the cut is above the high watermark, so that is the highwater as of the
    cut when every kept batch was cut."""
    if plog.log_start_offset == 0:
        return []
    in_log = pids_with_data(plog.iter_headers(0), end)
    rows: list[Row] = []
    for row in state.export_rows([p for p in state.pids() if p not in in_log]):
        kept = cut_row(row, end, state.durable_highwater(row[0]))
        if kept is not None:
            rows.append(kept)
    return rows


def rebuild_from_log(
    state: ProducerStateTable, plog: PartitionLog, hw: int, now_ms: int, kept: list[Row] | None
) -> None:
    """Producer state from the log (and ``kept``, the rows of PIDs whose data batches
    retention deleted); batches above the high watermark ``hw`` pending."""
    state.clear()
    if kept:
        state.load_rows(kept)
    for h in plog.iter_headers(0):
        if h.is_control:
            state.apply_fence(h.pid, h.generation, now_ms)
        else:
            state.apply_append(
                h.pid,
                h.generation,
                h.base_sequence,
                h.count,
                h.base_offset,
                now_ms,
                durable=h.base_offset + h.count <= hw,
            )


# -- a follower starting over at its leader's log start --------------------------------------
def rows_below_log_start(
    state: ProducerStateTable, topic: str, partition: int, start: int, truncations: int, now: int
) -> bytes:
    """The leader's side of a start-over: its rows as of its log start (``row_below``):
    the rows of the PIDs with no data batch left in its log (their batches are all below
    the start, committed) and the batches below the start of the PIDs that also wrote
    above it (the follower replays those), with the horizon of what it dropped
    (``dropped_last_use_max_ms``: the follower, once it leads, must not create a PID whose
    state was dropped here), in the snapshot file's format (checksummed)."""
    rows = [r for r in (row_below(row, start) for row in state.export_rows()) if r is not None]
    image = PartitionImage(start, start, rows, truncations, state.dropped_last_use_max_ms)
    return encode_snapshot(Snapshot(now, {(topic, partition): image}))


def start_over(
    state: ProducerStateTable,
    epochs: EpochHistory,
    plog: PartitionLog,
    key: tuple[str, int],
    offset: int,
    leader: PartitionImage | None,
    now_ms: int,
) -> list[Row]:
    """Persist the state a follower adopts when it starts over at ``offset`` and return
    its rows; the caller then drops the log (``PartitionLog.restart_at``) and loads them.
    Every batch here is below the leader's log start, so committed: this replica's rows
    stay, all durable; the leader's (``rows_below_log_start``, as of its log start) bring
    the PIDs that wrote in the skipped range, and replace the rows this replica has of
    them (their generation never goes back).

    Order (each step fsynced before the next; OSError from the first two changes nothing
    that counts): the image is written at the truncation count + 1, then that count is
    saved (older snapshots no longer trusted, the image now is), then the caller drops
    the log. A follower killed after the start-over but before its next snapshot recovers
    the adopted rows (issue 23 item 3), not an older snapshot's."""
    if leader is not None:
        state.note_dropped(leader.dropped_last_use_max_ms)
    rows = state.export_rows()
    if leader is not None and leader.rows:
        rows = adopt_rows(rows, leader.rows)
    image = PartitionImage(
        offset, offset, rows, epochs.truncations + 1, state.dropped_last_use_max_ms
    )
    write_atomically(plog.dir / START_OVER_FILE, encode_snapshot(Snapshot(now_ms, {key: image})))
    with epochs.change():
        epochs.truncations += 1
    return rows


def forget_start_over(directory: Path) -> None:
    """A server snapshot now holds the partition: its start-over image is superseded."""
    try:
        (directory / START_OVER_FILE).unlink(missing_ok=True)
    except OSError as exc:  # harmless: the snapshot's rows are newer, recovery takes them
        log.warning("%s: could not remove %s (%s)", directory.name, START_OVER_FILE, describe(exc))
