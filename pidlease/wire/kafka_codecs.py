"""Kafka's compression codecs for RecordBatch v2, decompression only and bounded: the
records of a compressed batch (the bytes after its 61-byte header) as the producer
compressed them, never more than ``limit`` bytes out, whatever the input says (a
decompression bomb stops at the bound and is refused, not expanded in memory).

The codec is attributes bits 0-2: 1 gzip (zlib), 2 snappy (raw, or the xerial framing the
Java client and aiokafka write), 3 lz4 (the LZ4 frame format), 4 zstd. The C-backed packages
are ``lz4`` and ``zstandard``; snappy comes from ``cramjam`` (whose raw snappy states the
uncompressed length up front, checked before anything is allocated); gzip from zlib.
A codec whose package cannot be imported is ``CodecError("unavailable", ...)``: refused
with a clear message, never stored unchecked.

Used by the Produce check (``kafka_batch.validate_kafka_batch``) and by every reader of the
log (``protocol.iter_records``), so there is one decode.
"""

from __future__ import annotations

import importlib
import struct
import zlib
from typing import Any, Literal

__all__ = [
    "CODEC_NAMES",
    "DECOMPRESSED_BYTES_MAX",
    "GZIP",
    "LZ4",
    "SNAPPY",
    "ZSTD",
    "CodecError",
    "compress",
    "decompress",
]

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODEC_NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
# What one batch's records may decompress to. A Produce's batch is at most
# batch_bytes_max (1 MiB by default) compressed; 64 MiB leaves room for very repetitive
# records and keeps a bomb's cost at one bounded buffer.
DECOMPRESSED_BYTES_MAX = 64 * 1024 * 1024

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = 16  # magic (8) + version i32 + compatible version i32
_I32 = struct.Struct(">i")
_ZSTD_STEP = 256  # input bytes per step (see _zstd)

Kind = Literal["unsupported", "unavailable", "too_large", "corrupt"]


class CodecError(Exception):
    """``kind``: "unsupported" (not a codec of Kafka's), "unavailable" (its package is not
    installed here), "too_large" (over the bound), "corrupt" (does not decompress)."""

    def __init__(self, kind: Kind, message: str) -> None:
        super().__init__(message)
        self.kind: Kind = kind


def decompress(codec: int, data: bytes | memoryview, limit: int = DECOMPRESSED_BYTES_MAX) -> bytes:
    """The bytes ``data`` decompresses to with ``codec``; CodecError otherwise."""
    if codec in CODEC_NAMES and codec != NONE and not data:
        raise CodecError("corrupt", f"{CODEC_NAMES[codec]}: no compressed data")
    if codec == GZIP:
        return _gzip(bytes(data), limit)
    if codec == SNAPPY:
        return _snappy(bytes(data), limit)
    if codec == LZ4:
        return _lz4(bytes(data), limit)
    if codec == ZSTD:
        return _zstd(bytes(data), limit)
    raise CodecError("unsupported", f"compression codec {codec} is not one of Kafka's")


def compress(codec: int, data: bytes) -> bytes:
    """``data`` compressed as librdkafka does (snappy raw, lz4 in frames). For tests and
    tools: the server never compresses."""
    if codec == GZIP:
        return zlib.compress(data, wbits=31)
    if codec == SNAPPY:
        import cramjam

        return bytes(cramjam.snappy.compress_raw(data))
    if codec == LZ4:
        return bytes(_lz4_frame().compress(data))
    if codec == ZSTD:
        import zstandard

        return zstandard.ZstdCompressor().compress(data)
    raise CodecError("unsupported", f"compression codec {codec} is not one of Kafka's")


def _too_large(name: str, limit: int) -> CodecError:
    return CodecError("too_large", f"{name} records decompress to more than {limit} bytes")


def _gzip(data: bytes, limit: int) -> bytes:
    out = bytearray()
    rest = data
    # A gzip stream may hold several members (Java's GZIPInputStream reads them all).
    while True:
        d = zlib.decompressobj(wbits=47)  # gzip or zlib header
        try:
            out += d.decompress(rest, limit + 1 - len(out))
        except zlib.error as exc:
            raise CodecError("corrupt", f"gzip: {exc}") from None
        if len(out) > limit or d.unconsumed_tail:
            raise _too_large("gzip", limit)
        if not d.eof:
            raise CodecError("corrupt", "gzip: stream ends early")
        rest = d.unused_data
        if not rest:
            return bytes(out)


def _snappy(data: bytes, limit: int) -> bytes:
    try:
        import cramjam
    except ImportError:
        raise CodecError("unavailable", "snappy needs the cramjam package") from None
    snappy: Any = cramjam.snappy
    if not data.startswith(_XERIAL_MAGIC):
        return _snappy_raw(snappy, data, limit)
    # xerial framing: header, then blocks of (i32 length, raw snappy)
    out = bytearray()
    p = _XERIAL_HEADER
    if len(data) < p:
        raise CodecError("corrupt", "snappy: short xerial header")
    while p < len(data):
        if p + 4 > len(data):
            raise CodecError("corrupt", "snappy: truncated xerial block length")
        (n,) = _I32.unpack_from(data, p)
        p += 4
        if n < 0 or p + n > len(data):
            raise CodecError("corrupt", f"snappy: xerial block of {n} bytes runs past the data")
        out += _snappy_raw(snappy, data[p : p + n], limit - len(out))
        p += n
    return bytes(out)


def _snappy_raw(snappy: Any, data: bytes, limit: int) -> bytes:
    try:
        # Raw snappy begins with the uncompressed length: checked before decompressing.
        n = int(snappy.decompress_raw_len(data))
    except Exception as exc:  # noqa: BLE001 - cramjam raises its own error types
        raise CodecError("corrupt", f"snappy: {exc}") from None
    if n > limit:
        raise _too_large("snappy", limit)
    try:
        return bytes(snappy.decompress_raw(data))
    except Exception as exc:  # noqa: BLE001
        raise CodecError("corrupt", f"snappy: {exc}") from None


def _lz4_frame() -> Any:
    """The ``lz4.frame`` module, imported by name: lz4 ships no type hints, and a static
    import made a user's ``mypy --strict`` (without this project's config) fail inside
    this module (tests/unit/test_public_types.py, in a fresh clone)."""
    return importlib.import_module("lz4.frame")


def _lz4(data: bytes, limit: int) -> bytes:
    try:
        frame = _lz4_frame()
    except ImportError:
        raise CodecError("unavailable", "lz4 needs the lz4 package") from None
    out = bytearray()
    rest = data
    while True:
        d = frame.LZ4FrameDecompressor()
        try:
            out += d.decompress(rest, max_length=limit + 1 - len(out))
        except RuntimeError as exc:
            raise CodecError("corrupt", f"lz4: {exc}") from None
        if len(out) > limit or (d.needs_input is False and not d.eof):
            raise _too_large("lz4", limit)
        if not d.eof:
            raise CodecError("corrupt", "lz4: frame ends early")
        rest = d.unused_data
        if not rest:
            return bytes(out)


def _zstd(data: bytes, limit: int) -> bytes:
    try:
        import zstandard
    except ImportError:
        raise CodecError("unavailable", "zstd needs the zstandard package") from None
    # Fed a small slice at a time (the decompressor has no output bound of its own): one
    # slice expands to a few MiB at most, so the bound holds within that, and a frame cut
    # short is seen (``eof`` never comes), not taken as its prefix.
    out = bytearray()
    rest = data
    try:
        while rest:
            d = zstandard.ZstdDecompressor().decompressobj()
            for p in range(0, len(rest), _ZSTD_STEP):
                out += d.decompress(rest[p : p + _ZSTD_STEP])
                if len(out) > limit:
                    raise _too_large("zstd", limit)
                if d.eof:
                    break
            if not d.eof:
                raise CodecError("corrupt", "zstd: frame ends early")
            rest = d.unused_data
    except zstandard.ZstdError as exc:
        raise CodecError("corrupt", f"zstd: {exc}") from None
    return bytes(out)
