"""The streaming read side of the data source: ``spark.readStream.format("pidlease")``.

Offsets are the log's own: a micro-batch's offset is ``{"<partition>": next offset}`` for
every partition of the topic, so the range a micro-batch reads is ``[start[p], end[p])``
of each partition. Spark writes that range into the query's checkpoint (its offset log)
*before* the batch runs and replays exactly that range after a crash; a pidlease partition
is an immutable log, so a replay reads the same records in the same order. With the
exactly-once streaming sink (``pidlease.spark.sink``, content identity: docs/pipeline.md) the
replayed batch maps to the same ids, which the output partitions resolve as duplicates:
pidlease -> pidlease is effectively once across restarts (docs/processing.md).

The planning rules are the pure functions at the top (``next_end``, ``plan_ranges``,
``parse_offsets``); ``StreamScan`` asks the coordinator for the high watermarks (the
leaders' answers, fresh) and reads each range with the SDK's ``Reader`` in the tasks.

- ``starting_offsets``: ``earliest`` (default: each partition's log start) or ``latest``
  (the high watermark when the query first starts; only a new checkpoint looks at it).
- ``max_records_per_trigger``: at most this many records per micro-batch, shared fairly
  over the partitions that have some (Spark's ``ReadMaxRows``); default: all there is.
- ``Trigger.AvailableNow``: the high watermarks when the query starts are its end.
- A partition whose leader does not answer (high watermark unknown) stays where it is
  until a later trigger; a partition added to the topic starts at offset 0.
- Records retention deleted before the query read them fail the task with
  ``OffsetOutOfRange`` ("records lost at the source"): never skipped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from pidlease import errors
from pidlease.client.lease_client import LeaseClient
from pidlease.client.reader import Reader
from pidlease.spark.errors import OptionError, PipelineError
from pidlease.spark.options import SPLIT_RECORDS_DEFAULT, _get, _int, _topic, coordinator_url
from pidlease.spark.scan import ArrowRecords

log = logging.getLogger("pidlease.spark.stream_source")

# How long a task waits for the records of its range to be readable (a leader failover of
# the input: the new leader's high watermark can lag the old one's for a moment).
RANGE_WAIT_S = 60.0
RANGE_POLL_S = 0.2

Offsets = dict[int, int]


# -- the rules -------------------------------------------------------------------------
def parse_offsets(raw: Mapping[str, Any]) -> Offsets:
    """A checkpointed offset (``{"0": 12, "1": 40}``) as partition -> next offset."""
    try:
        out = {int(p): int(o) for p, o in raw.items()}
    except (TypeError, ValueError):
        raise PipelineError(f"not a pidlease stream offset: {dict(raw)!r}") from None
    if any(p < 0 or o < 0 for p, o in out.items()):
        raise PipelineError(f"not a pidlease stream offset: {dict(raw)!r}")
    return out


def dump_offsets(offsets: Offsets) -> dict[str, int]:
    """The JSON form Spark checkpoints (keys must be strings)."""
    return {str(p): offsets[p] for p in sorted(offsets)}


def next_end(
    start: Offsets,
    high_watermarks: Mapping[int, int],
    *,
    max_records: int | None = None,
    target: Offsets | None = None,
) -> Offsets:
    """The end of the next micro-batch from ``start``: each partition's high watermark
    (``-1``: unknown, the partition stays), never below ``start`` (a range never goes back),
    never above ``target`` (Trigger.AvailableNow), and with ``max_records`` at most that
    many records in all, shared by water-filling: every partition with records gets an
    equal share, what a partition cannot use goes to the others."""
    end: Offsets = {}
    room: dict[int, int] = {}
    for p, hw in high_watermarks.items():
        s = start.get(p, 0)
        top = hw if hw >= 0 else s
        if target is not None:
            top = min(top, target.get(p, s))
        end[p] = s
        room[p] = max(0, top - s)
    for p, s in start.items():  # a partition the answer missed: it stays
        end.setdefault(p, s)
    if max_records is None:
        return {p: end[p] + room.get(p, 0) for p in end}
    budget = max_records
    open_ = sorted(p for p, r in room.items() if r > 0)
    while budget > 0 and open_:
        share = max(1, budget // len(open_))
        for p in list(open_):
            take = min(share, room[p], budget)
            end[p] += take
            room[p] -= take
            budget -= take
            if room[p] == 0:
                open_.remove(p)
            if budget == 0:
                break
    return end


@dataclass(frozen=True)
class StreamRange(InputPartition):
    """Offsets ``[start, end)`` of one topic partition, read by one task."""

    partition: int
    start: int
    end: int


def plan_ranges(start: Offsets, end: Offsets, split_records: int) -> list[StreamRange]:
    """The tasks of one micro-batch: each partition's ``[start, end)`` cut in pieces of at
    most ``split_records`` records; nothing for a partition with nothing new."""
    out: list[StreamRange] = []
    for p in sorted(end):
        s, e = start.get(p, 0), end[p]
        if e < s:
            raise PipelineError(
                f"partition {p}: the micro-batch ends at {e}, before its start {s} "
                "(a checkpoint of another topic, or a topic deleted and re-created?)"
            )
        out.extend(StreamRange(p, a, min(a + split_records, e)) for a in range(s, e, split_records))
    return out


# -- settings ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StreamReadSettings:
    coordinator: str
    topic: str
    starting_offsets: str = "earliest"
    max_records_per_trigger: int | None = None
    split_records: int = SPLIT_RECORDS_DEFAULT
    api_token: str | None = None

    @classmethod
    def parse(cls, o: Mapping[str, str]) -> StreamReadSettings:
        starting = (_get(o, "starting_offsets") or "earliest").lower()
        if starting not in ("earliest", "latest"):
            raise OptionError(f"option starting_offsets={starting!r} must be earliest or latest")
        return cls(
            coordinator=coordinator_url(o),
            topic=_topic(o),
            starting_offsets=starting,
            max_records_per_trigger=_int(o, "max_records_per_trigger", None, low=1),
            split_records=_int(o, "split_records", SPLIT_RECORDS_DEFAULT, low=1) or 1,
            api_token=_get(o, "api_token") or None,
        )


# -- the reader Spark drives -------------------------------------------------------------
class StreamScan(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, settings: StreamReadSettings) -> None:
        self.settings = settings
        self._target: Offsets | None = None

    def _log_offsets(self) -> dict[int, tuple[int, int]]:
        """Partition -> (log start, high watermark), as the leaders answer now (-1s: the
        leader did not answer)."""
        s = self.settings
        try:
            with LeaseClient(s.coordinator, api_token=s.api_token) as client:
                body = client.call("GET", f"/v1/topics/{s.topic}")
        except errors.UnknownTopicOrPartition:
            raise OptionError(
                f"topic {s.topic!r} does not exist at {s.coordinator}: a stream reads an "
                "existing topic"
            ) from None
        out: dict[int, tuple[int, int]] = {}
        for p in range(int(body["partitions"])):
            out[p] = (-1, -1)
        for row in body.get("partition_states", []):
            out[int(row["partition"])] = (
                int(row.get("log_start_offset", -1)),
                int(row.get("high_watermark", -1)),
            )
        return out

    def initialOffset(self) -> dict[str, int]:  # noqa: N802 - PySpark's method name
        marks = self._log_offsets()
        if self.settings.starting_offsets == "latest":
            unknown = [p for p, (_, hw) in marks.items() if hw < 0]
            if unknown:
                # "latest" must be a position, not a guess: 0 would read the whole log.
                raise PipelineError(
                    f"starting_offsets=latest: the leaders of partitions {unknown} of "
                    f"{self.settings.topic!r} did not answer; start the query again later"
                )
            return dump_offsets({p: hw for p, (_, hw) in marks.items()})
        return dump_offsets({p: max(0, start) for p, (start, _) in marks.items()})

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - PySpark's method name
        self._target = {p: hw for p, (_, hw) in self._log_offsets().items() if hw >= 0}
        log.info("%s: Trigger.AvailableNow reads up to %s", self.settings.topic, self._target)

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802 - PySpark's method name
        n = self.settings.max_records_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def latestOffset(  # noqa: N802 - PySpark's method name
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, int]:
        # ``start``/``limit`` come from PySpark >= 4.2; an older one calls latestOffset()
        # and reads everything there is.
        begin = parse_offsets(start or {})
        max_records = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        marks = {p: hw for p, (_, hw) in self._log_offsets().items()}
        return dump_offsets(next_end(begin, marks, max_records=max_records, target=self._target))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return plan_ranges(parse_offsets(start), parse_offsets(end), self.settings.split_records)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, StreamRange)
        return read_range(self.settings, partition)

    def commit(self, end: dict[str, Any]) -> None:
        # The offsets live in Spark's checkpoint; nothing is held here.
        log.debug("%s: committed up to %s", self.settings.topic, end)


def read_range(settings: StreamReadSettings, rng: StreamRange) -> Iterator[Any]:
    """Every record of ``[rng.start, rng.end)`` as Arrow batches (``pidlease.spark.scan``'s
    schema), in offset order. The range was below the high watermark when it was planned,
    so its records exist: the reader goes on until its position reaches ``end`` (control
    records take offsets and are not returned), waiting up to ``RANGE_WAIT_S`` without
    progress for a new leader to catch up; a range that retention deleted raises
    ``OffsetOutOfRange``."""
    if rng.end <= rng.start:
        return
    topic, p = settings.topic, rng.partition
    out = ArrowRecords(topic, p)
    deadline, progressed = time.monotonic() + RANGE_WAIT_S, rng.start
    with Reader(settings.coordinator, topic, p, rng.start, api_token=settings.api_token) as reader:
        while reader.position < rng.end:
            try:
                for rec in reader:
                    if rec.offset >= rng.end:
                        break
                    if out.add(rec):
                        yield out.batch()
            except errors.OffsetOutOfRange as exc:
                raise errors.OffsetOutOfRange(
                    f"records lost at the source: {topic!r} partition {p} offsets from "
                    f"{reader.position} were deleted by retention before this stream read "
                    f"them (the log starts at {exc.extra.get('earliest')}); nothing was "
                    "skipped: start a new query (a new checkpoint) to accept the loss",
                    earliest=exc.extra.get("earliest"),
                    latest=exc.extra.get("latest"),
                ) from exc
            if reader.position < rng.end:
                if reader.position > progressed:  # moving: the wait starts again
                    progressed, deadline = reader.position, time.monotonic() + RANGE_WAIT_S
                if time.monotonic() > deadline:
                    raise PipelineError(
                        f"{topic!r} partition {p}: offsets {reader.position}..{rng.end - 1} "
                        f"of this micro-batch were not readable for {RANGE_WAIT_S:.0f} s "
                        f"(high watermark {reader.high_watermark})"
                    )
                time.sleep(RANGE_POLL_S)
    if out:
        yield out.batch()
