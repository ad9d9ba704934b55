"""A raw Kafka client for tests of the Kafka listener: RecordBatch v2 built by hand (from
the format's description, not from the server's code), requests through kio, one blocking
socket. Real clients (confluent-kafka, aiokafka, kcat) cover the happy paths; this one
sends what they never would."""

from __future__ import annotations

import io
import socket
import struct
import time
from typing import Any

import crc32c
from kio.serial import entity_reader, entity_writer

from partition_server.kafka import codec as C


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def _varint(n: int) -> bytes:
    z = _zigzag(n)
    out = bytearray()
    while True:
        b = z & 0x7F
        z >>= 7
        if z:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def record_batch(
    values: list[bytes],
    *,
    pid: int = -1,
    epoch: int = -1,
    base_sequence: int = -1,
    timestamp_ms: int | None = None,
    key: bytes | None = None,
) -> bytes:
    """One uncompressed RecordBatch v2 (magic 2), CRC-32C over attributes..end."""
    ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    recs = bytearray()
    for i, v in enumerate(values):
        body = bytearray(b"\0")  # attributes
        body += _varint(0) + _varint(i)  # timestamp delta, offset delta
        body += _varint(-1) if key is None else _varint(len(key)) + key
        body += _varint(len(v)) + v
        body += _varint(0)  # headers
        recs += _varint(len(body)) + body
    after_crc = struct.pack(
        ">hiqqqhii", 0, len(values) - 1, ts, ts, pid, epoch, base_sequence, len(values)
    ) + bytes(recs)
    crc = crc32c.crc32c(after_crc)
    head = struct.pack(">qiibI", 0, 4 + 1 + 4 + len(after_crc), 0, 2, crc)
    return head + after_crc


class KafkaWire:
    """Blocking requests on one connection; ``request`` returns the decoded response."""

    def __init__(self, address: str, timeout_s: float = 30.0) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.corr = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> KafkaWire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def frame(self, api_key: int, version: int, values: dict[str, Any]) -> bytes:
        """A whole request frame (size included) of this API version."""
        self.corr += 1
        body = C.build(C.request_type(api_key, version), values)
        head = struct.pack(">hhi", api_key, version, self.corr) + struct.pack(">h", 5) + b"tests"
        if type(body).__flexible__:
            head += b"\0"
        out = io.BytesIO()
        entity_writer(type(body))(out, body)
        payload = head + out.getvalue()
        return struct.pack(">i", len(payload)) + payload

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_response(self, api_key: int, version: int) -> Any:
        body = self.read_frame()
        cls = C.response_type(api_key, version)
        at = 4 + (1 if cls.__flexible__ and api_key != C.API_VERSIONS else 0)
        obj, _ = entity_reader(cls)(body, at)
        return obj

    def read_frame(self) -> bytes:
        (n,) = struct.unpack(">i", self._exact(4))
        return self._exact(n)

    def request(self, api_key: int, version: int, values: dict[str, Any]) -> Any:
        self.send_raw(self.frame(api_key, version, values))
        return self.read_response(api_key, version)

    def closed_by_peer(self, timeout_s: float = 10.0) -> bool:
        """Whether the server closes the connection (EOF) within ``timeout_s``."""
        self.sock.settimeout(timeout_s)
        try:
            while True:
                got = self.sock.recv(65536)
                if not got:
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False

    def _exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            got = self.sock.recv(n - len(buf))
            if not got:
                raise EOFError(f"connection closed after {len(buf)} of {n} bytes")
            buf += got
        return bytes(buf)


def produce_values(topic: str, partition: int, batch: bytes, acks: int = -1) -> dict[str, Any]:
    import datetime as dt

    return {
        "acks": acks,
        "timeout": dt.timedelta(seconds=30),
        "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": batch}]}],
    }


def fetch_values(topic: str, partition: int, offset: int, max_wait_ms: int = 0) -> dict[str, Any]:
    import datetime as dt

    return {
        "replica_id": -1,
        "max_wait": dt.timedelta(milliseconds=max_wait_ms),
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "topics": [
            {
                "topic": topic,
                "partitions": [
                    {
                        "partition": partition,
                        "fetch_offset": offset,
                        "partition_max_bytes": 1 << 20,
                        "log_start_offset": -1,
                        "current_leader_epoch": -1,
                    }
                ],
            }
        ],
    }
