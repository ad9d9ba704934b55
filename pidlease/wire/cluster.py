"""The cluster's shared state in ZooKeeper: paths and the JSON records stored there.

The coordinator and the partition servers both read and write these; nothing else does.
All paths are relative to the ZooKeeper chroot in the hosts string (default
``127.0.0.1:2181/pidlease``), so several clusters or tests can share one ensemble.

    /pid_block                       next unallocated PID (ASCII int), advanced by CAS
    /pids/<pid>                      PidRecord JSON; its znode version is the CAS token
    /names/<quoted producer name>    the PID bound to that name (ASCII int)
    /topics/<name>                   TopicSpec JSON
    /topics/<name>/partitions/<p>    PartitionState JSON (leader, replicas, isr, epoch)
    /servers/<id>                    ephemeral ServerInfo JSON of a live partition server
    /coordinators/<id>               ephemeral, one per live coordinator
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import quote, unquote

PID_BLOCK = "/pid_block"
PIDS = "/pids"
NAMES = "/names"
TOPICS = "/topics"
SERVERS = "/servers"
COORDINATORS = "/coordinators"
ALL_ROOTS = (PIDS, NAMES, TOPICS, SERVERS, COORDINATORS)

DEDUP_MODES = ("strict", "monotonic", "off")


def pid_path(pid: int) -> str:
    return f"{PIDS}/{pid}"


def name_path(producer_name: str) -> str:
    return f"{NAMES}/{quote(producer_name, safe='')}"


def name_from_node(node: str) -> str:
    return unquote(node)


def topic_path(topic: str) -> str:
    return f"{TOPICS}/{topic}"


def partition_path(topic: str, partition: int) -> str:
    return f"{TOPICS}/{topic}/partitions/{partition}"


def server_path(server_id: int) -> str:
    return f"{SERVERS}/{server_id}"


def _dump(obj: Any) -> bytes:
    return json.dumps(asdict(obj), separators=(",", ":")).encode()


RETENTION_MS_DEFAULT = 7 * 24 * 3600 * 1000  # a week, as Kafka's log.retention.hours
SEGMENT_MS_DEFAULT = 7 * 24 * 3600 * 1000  # an idle active segment rolls after a week
SEGMENT_BYTES_MIN = 4096
SEGMENT_BYTES_MAX = 1 << 30  # 1 GiB: a segment is read and indexed whole at recovery
INT64_MAX = 2**63 - 1
# The topic settings that may change after creation (PATCH /v1/topics/{name}, Kafka's
# IncrementalAlterConfigs); the others (partitions, replication factor, dedup) are fixed
# for a topic's life (partitions only grow: Kafka's CreatePartitions).
LOG_SETTINGS = (
    "retention_ms",
    "retention_bytes",
    "segment_bytes",
    "segment_ms",
    "min_insync_replicas",
)


def log_setting_problem(field: str, value: int) -> str | None:
    """Why ``value`` is not a valid ``field`` (one of LOG_SETTINGS), or None when it is.
    The holes the ranges leave (a retention of 0, a 10-byte segment) would delete or roll
    on every write, so they are refused rather than clamped."""
    if field in ("retention_ms", "retention_bytes") and value == 0:
        return f"{field} must be -1 (no limit) or at least 1, not 0"
    if field == "segment_ms" and value == 0:
        return "segment_ms must be -1 (never roll by time) or at least 1, not 0"
    if (
        field == "segment_bytes"
        and value != 0
        and not (SEGMENT_BYTES_MIN <= value <= SEGMENT_BYTES_MAX)
    ):
        return (
            f"segment_bytes must be 0 (the server's segment_bytes_max) or "
            f"{SEGMENT_BYTES_MIN}..{SEGMENT_BYTES_MAX} (1 GiB), not {value}"
        )
    if not -1 <= value <= INT64_MAX:
        return f"{field} must be -1..{INT64_MAX}, not {value}"
    if field in ("segment_bytes", "min_insync_replicas") and value < 0:
        return f"{field} must be 0 (the default) or more, not {value}"
    return None


@dataclass
class TopicSpec:
    """A topic's record. The log settings (retention, segments, min in-sync replicas) may
    change after creation (``PATCH /v1/topics/{name}``); every replica picks them up from
    this record. -1 means "no limit"; a ``segment_bytes`` or ``min_insync_replicas`` of 0
    means "the default" (the server's ``segment_bytes_max``; ``default_min_insync``)."""

    name: str
    partitions: int
    replication_factor: int = 1
    dedup: str = "strict"
    created_ms: int = 0
    retention_ms: int = RETENTION_MS_DEFAULT
    retention_bytes: int = -1
    segment_bytes: int = 0
    segment_ms: int = SEGMENT_MS_DEFAULT
    min_insync_replicas: int = 0

    def to_bytes(self) -> bytes:
        return _dump(self)

    @classmethod
    def from_bytes(cls, raw: bytes) -> TopicSpec:
        # Records written before a field existed read it as its default, and a field
        # added by a newer version is ignored (a mixed-version cluster during an upgrade).
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in json.loads(raw).items() if k in known})

    @property
    def min_insync(self) -> int:
        """The in-sync replicas a produce needs: the topic's setting, else 1 for R <= 2 and
        2 for R >= 3."""
        return self.min_insync_replicas or default_min_insync(self.replication_factor)


def default_min_insync(replication_factor: int) -> int:
    return 1 if replication_factor <= 2 else 2


@dataclass
class PartitionState:
    replicas: list[int]
    leader: int
    leader_epoch: int = 0
    isr: list[int] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        return _dump(self)

    @classmethod
    def from_bytes(cls, raw: bytes) -> PartitionState:
        return cls(**json.loads(raw))


@dataclass
class ServerInfo:
    id: int
    host: str
    port: int
    started_ms: int = 0
    kafka_port: int = 0  # the Kafka listener's port at ``host``; 0: none

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def to_bytes(self) -> bytes:
        return _dump(self)

    @classmethod
    def from_bytes(cls, raw: bytes) -> ServerInfo:
        # Unknown fields ignored: a newer server's record read by an older reader.
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in json.loads(raw).items() if k in known})


@dataclass
class PidRecord:
    """What the coordinator knows of a PID. ``partitions`` maps "topic/partition" to
    ``{"seen": bool}``: seen means a leader once reported state for this PID there, so
    a later "no state" answer means the state expired (UNKNOWN_PID), not "never written"."""

    pid: int
    generation: int
    producer_name: str | None = None
    expire_ms: int = 0
    expires_at_ms: int = 0
    last_use_ms: int = 0
    created_ms: int = 0
    partitions: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        return _dump(self)

    @classmethod
    def from_bytes(cls, raw: bytes) -> PidRecord:
        return cls(**json.loads(raw))


def tp_key(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def split_tp_key(key: str) -> tuple[str, int]:
    topic, _, p = key.rpartition("/")
    return topic, int(p)


_TOPIC_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
TOPIC_NAME_MAX = 200
PRODUCER_NAME_MAX = 255


def topic_name_problem(name: str) -> str | None:
    """Why ``name`` is not a valid topic name, or None when it is."""
    if not name or len(name) > TOPIC_NAME_MAX:
        return f"topic name must be 1..{TOPIC_NAME_MAX} characters"
    if name in (".", "..") or not set(name) <= _TOPIC_CHARS:
        return "topic name may hold only letters, digits, '.', '_' and '-'"
    return None


def connect_zk(hosts: str, *, timeout_s: float = 10.0, ensure_roots: bool = True) -> Any:
    """A started KazooClient for ``hosts`` (which may end in a chroot such as
    ``127.0.0.1:2181/pidlease``). The chroot and the layout's roots are created first, so
    a fresh ZooKeeper works without any setup step."""
    from kazoo.client import KazooClient

    server_part, slash, chroot = hosts.partition("/")
    if slash and chroot:
        boot = KazooClient(hosts=server_part, timeout=timeout_s)
        boot.start(timeout=timeout_s)
        try:
            boot.ensure_path("/" + chroot)
        finally:
            boot.stop()
            boot.close()
    zk = KazooClient(hosts=hosts, timeout=timeout_s)
    zk.start(timeout=timeout_s)
    if ensure_roots:
        for root in ALL_ROOTS:
            zk.ensure_path(root)
    return zk
