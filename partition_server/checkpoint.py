"""The high-watermark checkpoint: one small file per server holding, for each replicated
partition it hosts, a high watermark it has known (Kafka's replication-offset-checkpoint).

Why it exists: after a restart the producer state rebuilt from the log would call every
batch in the log durable, but on a replicated partition only what the in-sync replicas
hold (below the high watermark) is committed. Answering DUPLICATE for a batch above it and
then dying would lose a record the producer was told is written. So recovery caps the
durable highwaters at the checkpointed value, which may lag the true one (it is written
every ``hw_checkpoint_interval_ms``); lagging only means SEQUENCE_UNKNOWN (retry) a little
longer, never a wrong DUPLICATE.

File ``<data_dir>/high-watermarks``, text, replaced atomically::

    pidlease-hw 1 <crc32 of the lines below, hex>
    <topic> <partition> <high watermark>
"""

from __future__ import annotations

import logging
import zlib
from pathlib import Path

from partition_server.atomic_file import write_atomically
from pidlease.errors import describe

log = logging.getLogger("partition_server.checkpoint")

FILE_NAME = "high-watermarks"
_HEADER = "pidlease-hw 1"

Key = tuple[str, int]


class HighWatermarkCheckpoint:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / FILE_NAME
        self.last_written: dict[Key, int] = {}

    def read(self) -> dict[Key, int]:
        """The checkpointed values; empty when the file is missing or unreadable (then
        every replicated partition starts from high watermark 0: safe, only slower)."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        try:
            head, _, body = text.partition("\n")
            magic, crc = head.rsplit(" ", 1)
            if magic != _HEADER or int(crc, 16) != zlib.crc32(body.encode()):
                raise ValueError("bad header or checksum")
            out: dict[Key, int] = {}
            for line in body.splitlines():
                topic, p, hw = line.rsplit(" ", 2)
                out[(topic, int(p))] = int(hw)
        except ValueError as exc:
            log.error(
                "%s is unreadable (%s); replicated partitions restart from high watermark 0",
                self.path,
                describe(exc),
            )
            return {}
        self.last_written = dict(out)
        return out

    def write(self, values: dict[Key, int]) -> bool:
        """Replace the file when something changed (blocking; run it in an executor).
        True when it wrote."""
        if values == self.last_written:
            return False
        body = "".join(f"{t} {p} {hw}\n" for (t, p), hw in sorted(values.items()))
        data = f"{_HEADER} {zlib.crc32(body.encode()):08x}\n{body}".encode()
        write_atomically(self.path, data)
        self.last_written = dict(values)
        return True
