"""The group log's records and its compaction, pure: no sockets, no files, no clock.

A partition of ``__pidlease_groups`` holds Kafka records keyed by what they describe
(docs/kafka.md, "Consumer groups"):

- ``["o", group, topic, partition]``: a committed offset (``{"o", "e", "m", "ts"}``);
- ``["g", group]``: a group's generation, protocol type and when it went empty;
- a null (or empty) value: a tombstone. An offset's removes that offset; a group's
  removes the group *with all its offsets*;
- ``["c"]`` with ``{"from": S, "bytes": N}``: a **checkpoint marker**. The records from offset ``S``
  up to the marker are the whole image of the log as of ``S`` (``LogTable.image``): one
  group record per group and every live offset, nothing a tombstone removed.

``apply_record`` replays one record into the coordinator's groups; ``LogTable`` keeps the
same state as records (what a replay of the log so far would give), merged the way
``apply_record`` merges: the last value of an offset, and for a group the largest
generation and empty time and the last protocol type. Replaying a table's image on top of
the replay of *any* suffix of the records it was built from gives the same groups as
replaying all of them (a key's tombstone always follows its value, so a suffix that holds
a value of a key the image leaves out also holds the tombstone that removed it; group
records merge by max). So once a checkpoint is committed, every segment below ``S`` may
go, on every replica, each deciding from its own committed log (the same on all):
``tests/unit/server/kafka/test_group_log.py`` checks that rule against a replay of the whole log.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from partition_server.kafka import group_state as G
from partition_server.kafka.group_state import Group

log = logging.getLogger("partition_server.kafka.group_log")

CHECKPOINT_KEY = b'["c"]'


def offset_key(group_id: str, topic: str, partition: int) -> bytes:
    return json.dumps(["o", group_id, topic, partition]).encode()


def group_key(group_id: str) -> bytes:
    return json.dumps(["g", group_id]).encode()


def offset_value(e: G.OffsetEntry) -> bytes:
    return json.dumps(
        {"o": e.offset, "e": e.leader_epoch, "m": e.metadata, "ts": e.commit_ms}
    ).encode()


def group_value(g: Group, ts_ms: int) -> bytes:
    """A group's record; ``ts`` (when written; for a group going empty, when it did) starts
    its offsets' retention after a reload."""
    return json.dumps(
        {
            "gen": g.generation,
            "pt": g.protocol_type,
            "pn": g.protocol_name,
            "members": len(g.members),
            "ts": ts_ms,
        }
    ).encode()


def checkpoint_value(start: int, image_bytes: int) -> bytes:
    return json.dumps({"from": start, "bytes": image_bytes}).encode()


def checkpoint_size(value: bytes | None) -> int:
    """The image size a marker states (0 when it does not say)."""
    try:
        return int(json.loads(value or b"{}").get("bytes", 0))
    except (ValueError, TypeError, AttributeError):
        return 0


@dataclass(frozen=True)
class GroupRecord:
    generation: int
    protocol_type: str | None
    empty_since_ms: int


@dataclass(frozen=True)
class OffsetOp:
    group_id: str
    topic: str
    partition: int
    entry: G.OffsetEntry | None  # None: a tombstone


@dataclass(frozen=True)
class GroupOp:
    group_id: str
    record: GroupRecord | None  # None: a tombstone (the group and all its offsets)


@dataclass(frozen=True)
class MarkerOp:
    start: int


Op = OffsetOp | GroupOp | MarkerOp | None


def parse(key: bytes | None, value: bytes | None) -> Op:
    """One record of the group log, or None when it says nothing (no key, an unknown kind,
    or it does not parse: logged)."""
    if not key:
        return None
    try:
        k = json.loads(key)
        v = json.loads(value) if value else None
        if k[0] == "o":
            _, gid, topic, p = k
            if v is None:
                return OffsetOp(str(gid), str(topic), int(p), None)
            e = G.OffsetEntry(int(v["o"]), int(v["e"]), str(v["m"]), int(v["ts"]))
            return OffsetOp(str(gid), str(topic), int(p), e)
        if k[0] == "g":
            gid = str(k[1])
            if v is None:
                return GroupOp(gid, None)
            pt = v["pt"]
            rec = GroupRecord(int(v["gen"]), None if pt is None else str(pt), int(v.get("ts", 0)))
            return GroupOp(gid, rec)
        if k[0] == "c" and v is not None:
            return MarkerOp(int(v["from"]))
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        log.warning("group log: skipping a record that does not parse: %s", exc)
    return None


def apply_record(groups: dict[str, Group], key: bytes | None, value: bytes | None) -> None:
    """One record of the group log into ``groups`` (replay and live writes alike)."""
    op = parse(key, value)
    if isinstance(op, OffsetOp):
        if op.entry is None:
            g0 = groups.get(op.group_id)
            if g0 is not None:
                g0.offsets.pop((op.topic, op.partition), None)
            return
        g1 = groups.setdefault(op.group_id, Group(op.group_id))
        g1.offsets[(op.topic, op.partition)] = op.entry
    elif isinstance(op, GroupOp):
        rec = op.record
        if rec is None:
            groups.pop(op.group_id, None)
            return
        g = groups.setdefault(op.group_id, Group(op.group_id))
        g.generation = max(g.generation, rec.generation)
        g.protocol_type = rec.protocol_type
        g.empty_since_ms = max(g.empty_since_ms, rec.empty_since_ms)


def replay(records: Iterable[tuple[bytes | None, bytes | None]]) -> dict[str, Group]:
    groups: dict[str, Group] = {}
    for k, v in records:
        apply_record(groups, k, v)
    return groups


@dataclass
class _Entry:
    record: GroupRecord | None = None
    offsets: dict[tuple[str, int], G.OffsetEntry] = field(default_factory=dict)


class LogTable:
    """The state a replay of the group log's records so far gives, kept as records: its
    ``image`` replays to the same groups. ``checkpoint_from`` is the start of the newest
    checkpoint read (-1: none yet), below which the log may go."""

    def __init__(self) -> None:
        self.groups: dict[str, _Entry] = {}
        self.checkpoint_from = -1

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        op = parse(key, value)
        if isinstance(op, MarkerOp):
            self.checkpoint_from = max(self.checkpoint_from, op.start)
        elif isinstance(op, OffsetOp):
            if op.entry is None:
                got = self.groups.get(op.group_id)
                if got is not None:
                    got.offsets.pop((op.topic, op.partition), None)
                return
            self.groups.setdefault(op.group_id, _Entry()).offsets[(op.topic, op.partition)] = (
                op.entry
            )
        elif isinstance(op, GroupOp):
            rec = op.record
            if rec is None:
                self.groups.pop(op.group_id, None)
                return
            entry = self.groups.setdefault(op.group_id, _Entry())
            old = entry.record
            if old is not None:
                rec = GroupRecord(
                    max(old.generation, rec.generation),
                    rec.protocol_type,
                    max(old.empty_since_ms, rec.empty_since_ms),
                )
            entry.record = rec

    def image(self) -> list[tuple[bytes, bytes]]:
        """Records that replay to this state: per group its (merged) group record, then
        its offsets. A group known only by offsets gets a record of the defaults (what
        ``apply_record`` gives it), so an empty one is kept too."""
        out: list[tuple[bytes, bytes]] = []
        for gid, entry in self.groups.items():
            rec = entry.record or GroupRecord(0, None, 0)
            out.append(
                (
                    group_key(gid),
                    json.dumps(
                        {"gen": rec.generation, "pt": rec.protocol_type, "ts": rec.empty_since_ms}
                    ).encode(),
                )
            )
            for (topic, p), e in entry.offsets.items():
                out.append((offset_key(gid, topic, p), offset_value(e)))
        return out

    def offsets(self) -> int:
        return sum(len(e.offsets) for e in self.groups.values())


def checkpoint_batches(
    image: list[tuple[bytes, bytes]], start: int, batch_bytes: int
) -> list[list[tuple[bytes, bytes | None]]]:
    """The image as batches of at most about ``batch_bytes`` of keys and values each, the
    marker (naming ``start``, where the first batch lands) last in the last batch."""
    batches: list[list[tuple[bytes, bytes | None]]] = [[]]
    size = 0
    for k, v in image:
        n = len(k) + len(v) + 16
        if batches[-1] and size + n > batch_bytes:
            batches.append([])
            size = 0
        batches[-1].append((k, v))
        size += n
    total = sum(len(k) + len(v) for k, v in image)
    batches[-1].append((CHECKPOINT_KEY, checkpoint_value(start, total)))
    return batches


@dataclass(frozen=True)
class CompactPolicy:
    """When the leader writes a checkpoint: once what was written since the last one is at
    least ``min_bytes`` and at least the last image's size (so the log stays within about
    twice the live state plus ``min_bytes`` and a segment). ``min_bytes`` 0: never."""

    min_bytes: int

    def due(self, bytes_since: int, image_bytes: int) -> bool:
        return self.min_bytes > 0 and bytes_since >= max(self.min_bytes, image_bytes)
