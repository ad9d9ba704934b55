"""InitProducerId on any node: PIDs from the cluster's one ZooKeeper PID counter, and who
owns each Kafka PID.

PIDs come from ``/pid_block``, the counter the coordinator's allocator reserves blocks
from, by the same code (``pidlease.wire.pid_blocks``, one retry limit): reserve
``[next, next + block)`` by a compare-and-set on the znode's version, hand the block out
from memory. So a PID leased over HTTP and one given to
a Kafka client can never be the same, and a server that dies wastes only the rest of its
block. (The partition server may not import ``coordinator``, and calling a coordinator
over HTTP would make every InitProducerId depend on one being up; the counter is the
shared contract, described in ``pidlease/wire/cluster.py``.)

``/kafka_pids/<pid>`` records the principal that initialised the PID. The leader of a
partition reads it (once per PID, then cached) to refuse another principal's produce with
that PID when SASL is on. An InitProducerId that names a PID (v3+, after the client lost
track of its sequences) gets a new PID at epoch 0, as Kafka's broker answers a producer
without a transactional id, and the named PID's record is removed when the same principal
owns it: a record lives as long as its producer uses the PID. Records of producers that
simply stop are not removed (see docs/kafka.md, Limits).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import BadVersionError, NoNodeError

from pidlease.errors import CoordinatorUnavailable
from pidlease.wire.kafka_errors import UNKNOWN_SERVER_ERROR
from pidlease.wire.pid_blocks import PidBlocks, ZkCounter

KAFKA_PIDS = "/kafka_pids"
OWNERS_CACHED_MAX = 100_000


class PidError(Exception):
    """InitProducerId refused; ``code`` is the Kafka error to answer."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class KafkaPid:
    pid: int
    epoch: int
    principal: str


def kafka_pid_path(pid: int) -> str:
    return f"{KAFKA_PIDS}/{pid}"


class KafkaPids:
    """Blocking (kazoo); the listener calls it in an executor. Thread-safe."""

    def __init__(self, zk: Any, block_size: int) -> None:
        self._zk = zk
        self.block_size = block_size
        self._lock = threading.Lock()
        self._blocks = PidBlocks(ZkCounter(zk), block_size)
        self._owners: dict[int, str] = {}

    def init(self, principal: str, pid: int = -1, epoch: int = -1) -> KafkaPid:
        """A new PID at epoch 0, whatever ``pid`` and ``epoch`` say: Kafka's broker answers
        an InitProducerId without a transactional id the same way, ignoring the producer
        id and epoch a client sends (v3+, after UNKNOWN_PRODUCER_ID or a sequence it lost
        track of). The named PID's record is removed when ``principal`` owns it: its
        producer has moved to the new PID, and its batches are refused from then on."""
        rec = self._new(principal)
        if pid >= 0:
            self._forget(principal, pid)
        return rec

    def _forget(self, principal: str, pid: int) -> None:
        """Remove ``/kafka_pids/<pid>`` if ``principal`` owns it (best effort)."""
        try:
            raw, stat = self._zk.get(kafka_pid_path(pid))
            if _load(raw).principal != principal:
                return
            self._zk.delete(kafka_pid_path(pid), version=stat.version)
        except (NoNodeError, BadVersionError):
            return
        with self._lock:
            self._owners.pop(pid, None)

    def owner(self, pid: int) -> str | None:
        """The principal that initialised ``pid``, None when it was not a Kafka
        InitProducerId (an HTTP-leased PID, or none)."""
        got = self._owners.get(pid)
        if got is not None:
            return got
        rec = self._read(pid)
        if rec is None:
            return None
        self._remember(pid, rec.principal)
        return rec.principal

    # -- internals -------------------------------------------------------------------------
    def _new(self, principal: str) -> KafkaPid:
        pid = self._next_pid()
        rec = KafkaPid(pid, 0, principal)
        self._zk.ensure_path(KAFKA_PIDS)
        self._zk.create(kafka_pid_path(pid), _dump(rec))
        self._remember(pid, principal)
        return rec

    def _read(self, pid: int) -> KafkaPid | None:
        try:
            raw, _ = self._zk.get(kafka_pid_path(pid))
        except NoNodeError:
            return None
        return _load(raw)

    def _remember(self, pid: int, principal: str) -> None:
        with self._lock:
            if len(self._owners) >= OWNERS_CACHED_MAX:
                self._owners.pop(next(iter(self._owners)))
            self._owners[pid] = principal

    def _next_pid(self) -> int:
        try:
            return self._blocks.next_pid()
        except CoordinatorUnavailable as exc:  # a damaged or exhausted counter, or contention
            raise PidError(UNKNOWN_SERVER_ERROR, str(exc)) from exc

    @property
    def blocks_reserved(self) -> int:
        return self._blocks.blocks_fetched


def _dump(rec: KafkaPid) -> bytes:
    return json.dumps(
        {"pid": rec.pid, "epoch": rec.epoch, "principal": rec.principal, "at_ms": _now_ms()}
    ).encode()


def _load(raw: bytes) -> KafkaPid:
    d = json.loads(raw)
    return KafkaPid(int(d["pid"]), int(d["epoch"]), str(d["principal"]))


def _now_ms() -> int:
    return int(time.time() * 1000)
