"""A simulated Kafka idempotent producer (Kafka's Java client and librdkafka with
``enable.idempotence``), talking the Kafka wire protocol to the real Kafka listener of each
simulated server, over the simulated network. Only the wire: requests built with the
listener's own schemas (``kio``, ``partition_server/kafka/codec.py``), RecordBatch v2 built
by hand (``tests/kafka_wire.py``).

- Every connection authenticates first when the seed turns SASL on: SaslHandshake v1
  (PLAIN), then SaslAuthenticate (v0-v2) as ``alice`` or ``bob`` with its API token.
- InitProducerId (v0-v4) on any live server gives the PID (from ZooKeeper's ``/pid_block``)
  at epoch 0; with SASL the server records the principal as its owner, and the leader of
  each partition looks that owner up (a ZooKeeper ``get`` the first time on a node, in an
  executor every time) before it appends.
- Produce v3-v9 with ``acks=-1`` and a request timeout of 100 ms-1 s: one partition per
  request, up to ``max_in_flight`` requests pipelined on one connection, sequences from 0
  with no gap (Kafka's rules on strict and monotonic topics alike; none on ``off``).
- The rest is the native model's send loop (producer.py): a retriable answer
  (NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS(_AFTER_APPEND),
  KAFKA_STORAGE_ERROR, UNKNOWN_TOPIC_OR_PARTITION, a lost connection) stops new sends until
  every answer is in, then every unresolved batch is resent in order; OUT_OF_ORDER_SEQUENCE
  / UNKNOWN_PRODUCER_ID behind an earlier unresolved batch is retried with it, for the
  earliest it is fatal; a DUPLICATE is answered NO_ERROR with its first offsets.

No takeovers: a non-transactional Kafka producer never fences another holder of its PID.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kio.serial import entity_reader, entity_writer

from partition_server.kafka import codec as C
from pidlease import errors
from pidlease.wire.protocol import KAFKA_GENERATION_BASE
from tests.kafka_wire import record_batch
from tests.sim.producer import Batch, Connection, Lineage, Producer

if TYPE_CHECKING:
    from tests.sim.world import World

# Principals the servers know (``api_tokens``) when a seed turns SASL on.
PRINCIPALS = {"alice": "tok-alice", "bob": "tok-bob"}
API_TOKENS = ",".join(f"{n}:producer:{t}" for n, t in PRINCIPALS.items())

# Kafka error code -> the native code the send loop (producer.py) acts on.
_NONE = 0
_CODES = {
    6: errors.NotLeader.code,  # NOT_LEADER_OR_FOLLOWER
    3: errors.UnknownTopicOrPartition.code,  # UNKNOWN_TOPIC_OR_PARTITION
    5: errors.UnknownTopicOrPartition.code,  # LEADER_NOT_AVAILABLE
    7: errors.ServerUnavailable.code,  # REQUEST_TIMED_OUT
    19: errors.NotEnoughReplicas.code,  # NOT_ENOUGH_REPLICAS
    20: errors.NotEnoughReplicas.code,  # NOT_ENOUGH_REPLICAS_AFTER_APPEND
    56: errors.ServerUnavailable.code,  # KAFKA_STORAGE_ERROR
    45: errors.OutOfOrderSequence.code,  # OUT_OF_ORDER_SEQUENCE_NUMBER
    59: errors.UnknownPid.code,  # UNKNOWN_PRODUCER_ID
    47: errors.ProducerFenced.code,  # INVALID_PRODUCER_EPOCH
}
_RETRIABLE_INIT = {7, 6, 5, 15, 51}  # REQUEST_TIMED_OUT, ..., COORDINATOR_NOT_AVAILABLE


@dataclass
class KResponse:
    """A Produce answer in the shape the native send loop reads."""

    correlation_id: int
    error_code: int
    base_offset: int
    last_offset: int
    detail: str


def kafka_frame(api_key: int, version: int, corr: int, values: dict[str, Any]) -> bytes:
    body = C.build(C.request_type(api_key, version), values)
    head = struct.pack(">hhi", api_key, version, corr) + struct.pack(">h", 3) + b"sim"
    if type(body).__flexible__:
        head += b"\0"
    out = io.BytesIO()
    entity_writer(type(body))(out, body)
    payload = head + out.getvalue()
    return struct.pack(">i", len(payload)) + payload


def kafka_decode(api_key: int, version: int, body: bytes) -> tuple[int, Any]:
    """(correlation id, response) of a response frame (without its size)."""
    (corr,) = struct.unpack_from(">i", body)
    cls = C.response_type(api_key, version)
    at = 4 + (1 if cls.__flexible__ and api_key != C.API_VERSIONS else 0)
    obj, _ = entity_reader(cls)(body, at)
    return corr, obj


class KafkaProducer(Producer):
    """One Kafka idempotent producer of one partition (its lineage's only holder)."""

    def __init__(self, world: World, lin: Lineage) -> None:
        super().__init__(world, lin, takeover=False)
        self.principal = lin.principal
        rng = self.rng
        self.produce_version = rng.randint(3, 9)
        self.sasl_version = rng.randint(0, 2)
        self.init_version = rng.randint(0, 4)
        self.timeout_ms = rng.choice([100, 300, 1000])

    # -- connections ---------------------------------------------------------------------
    async def _open(self, address: str) -> Connection | None:
        """Connect and (with SASL) authenticate; None when that failed."""
        try:
            r, wr = await self.w.net.connect(address, self.tag)
        except ConnectionError:
            return None
        conn = Connection(r, wr)
        if not self.w.kafka_sasl:
            return conn
        try:
            corr = self._next_corr()
            wr.write(kafka_frame(C.SASL_HANDSHAKE, 1, corr, {"mechanism": "PLAIN"}))
            _, hs = kafka_decode(C.SASL_HANDSHAKE, 1, await conn.read_frame())
            if int(hs.error_code) != 0:
                raise ConnectionResetError(f"SaslHandshake answered {int(hs.error_code)}")
            corr = self._next_corr()
            token = PRINCIPALS[self.principal]
            wr.write(
                kafka_frame(
                    C.SASL_AUTHENTICATE,
                    self.sasl_version,
                    corr,
                    {"auth_bytes": f"\0{self.principal}\0{token}".encode()},
                )
            )
            _, au = kafka_decode(C.SASL_AUTHENTICATE, self.sasl_version, await conn.read_frame())
            if int(au.error_code) != 0:
                self.lin.failed = f"{self.tag}: SASL refused: {getattr(au, 'error_message', '')}"
                raise ConnectionResetError("SASL refused")
        except (ConnectionError, asyncio.IncompleteReadError):
            wr.close()
            return None
        return conn

    async def _connect(self) -> Connection:
        backoff = 0.002
        while True:
            addr = self.w.kafka_leader_address(self.lin.topic, self.lin.partition)
            conn = await self._open(addr)
            if conn is not None:
                self.conn = conn
                return conn
            if self.lin.failed:
                raise _Fatal
            await asyncio.sleep(backoff * (0.5 + self.rng.random()))
            backoff = min(backoff * 2, 0.05)

    # -- the run -------------------------------------------------------------------------
    async def run(self) -> None:
        try:
            if self.lin.pid < 0 and not await self._init_pid():
                return
            self.token = b""
            await self._send_all()
        except _Fatal:
            pass
        finally:
            self._drop_conn()

    async def _init_pid(self) -> bool:
        lin = self.lin
        backoff = 0.002
        v = self.init_version
        values = {
            "transactional_id": None,
            "transaction_timeout": dt.timedelta(seconds=60),
            "producer_id": -1,
            "producer_epoch": -1,
        }
        for _ in range(200):
            sid = self.w.any_live_server()
            conn = await self._open(self.w.kafka_address(sid)) if sid else None
            if lin.failed:
                return False
            if conn is not None:
                corr = self._next_corr()
                conn.writer.write(kafka_frame(C.INIT_PRODUCER_ID, v, corr, values))
                try:
                    _, r = kafka_decode(C.INIT_PRODUCER_ID, v, await conn.read_frame())
                except (ConnectionError, asyncio.IncompleteReadError):
                    r = None
                conn.writer.close()
                if r is not None and int(r.error_code) == 0:
                    lin.pid = int(r.producer_id)
                    lin.generation = KAFKA_GENERATION_BASE + int(r.producer_epoch)
                    self.generation = lin.generation
                    self._trace(f"InitProducerId: pid {lin.pid} epoch {int(r.producer_epoch)}")
                    return True
                if r is not None and int(r.error_code) not in _RETRIABLE_INIT:
                    lin.failed = f"{self.tag}: InitProducerId answered {int(r.error_code)}"
                    return False
            await asyncio.sleep(backoff * (0.5 + self.rng.random()))
            backoff = min(backoff * 2, 0.05)
        lin.failed = f"{self.tag}: no PID after 200 InitProducerId attempts"
        return False

    def _build(self) -> Batch | None:
        lin = self.lin
        if lin.sent >= lin.batches_total:
            return None
        lin.sent += 1
        count = self.rng.randint(1, lin.records_max)
        base = lin.next_seq
        lin.next_seq = base + count
        epoch = lin.generation - KAFKA_GENERATION_BASE
        values = [
            f"{lin.name}/{lin.generation}/{base + i}/".encode() + b"x" * self.rng.randint(0, 8)
            for i in range(count)
        ]
        data = record_batch(
            values, pid=lin.pid, epoch=epoch, base_sequence=base, timestamp_ms=self.w.clock_ms()
        )
        return Batch(base, count, values, data)

    def _send(self, conn: Connection, b: Batch) -> int:
        b.sends += 1
        corr = self._next_corr()
        if self.w.verbose:
            self._trace(f"send [{b.base}..{b.base + b.count - 1}] as Produce {corr}")
        lin = self.lin
        values = {
            "transactional_id": None,
            "acks": -1,
            "timeout": dt.timedelta(milliseconds=self.timeout_ms),
            "topic_data": [
                {"name": lin.topic, "partition_data": [{"index": lin.partition, "records": b.data}]}
            ],
        }
        conn.writer.write(kafka_frame(C.PRODUCE, self.produce_version, corr, values))
        return corr

    def _decode(self, body: bytes) -> Any:
        corr, r = kafka_decode(C.PRODUCE, self.produce_version, body)
        pr = r.responses[0].partition_responses[0]
        code = int(pr.error_code)
        base = int(pr.base_offset)
        detail = f"Kafka error {code}: {getattr(pr, 'error_message', '')}" if code else ""
        native = 0 if code == _NONE else _CODES.get(code, errors.PidleaseError.code)
        return KResponse(corr, native, base, base, detail)


class _Fatal(Exception):
    pass
