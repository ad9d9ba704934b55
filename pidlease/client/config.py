"""The producer's settings: ``ProducerConfig``, the tuning, in one frozen, checked object
the parts of the engine that need it get (the partition senders, the accumulator); and
``ProducerSettings``, everything a producer is built from (the config included).
``AsyncProducer`` and ``Producer`` take each as a keyword of the same name and default.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from pidlease import errors
from pidlease.wire import protocol

if TYPE_CHECKING:
    import httpx

__all__ = ["DEFAULTS", "RECORD_OVERHEAD", "ProducerConfig", "ProducerSettings"]

RECORD_OVERHEAD = 8  # key_len + value_len of each record in the batch format


@dataclass(frozen=True, kw_only=True, slots=True)
class ProducerConfig:
    """The producer's tuning settings; ``AsyncProducer``/``Producer`` take each as a keyword
    of the same name and default. A value out of range raises ``ConfigError``."""

    max_in_flight: int = 5
    linger_ms: float = 5
    delivery_timeout_ms: int | None = None
    batch_bytes_max: int = 512 * 1024
    batch_records_max: int = 1000
    buffer_records_max: int = 50_000  # admitted but unresolved records; send() waits beyond
    request_timeout_ms: int = 30_000
    retry_backoff_ms: float = 50
    retry_backoff_max_ms: float = 1000
    start_timeout_ms: int = 30_000  # leasing at start: retried this long
    metadata_refresh_min_ms: float = 100  # at most one topic lookup per this interval

    def check(self) -> None:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise errors.ConfigError(f"producer setting {what}")

        for f in fields(self):  # a str from a config file would fail below as a TypeError
            v = getattr(self, f.name)
            need(
                (isinstance(v, (int, float)) and not isinstance(v, bool))
                or (v is None and f.name == "delivery_timeout_ms"),
                f"{f.name}={v!r} must be a number",
            )
        need(1 <= self.max_in_flight <= 100, f"max_in_flight={self.max_in_flight} must be 1..100")
        need(0 <= self.linger_ms <= 60_000, f"linger_ms={self.linger_ms} must be 0..60000")
        need(
            self.delivery_timeout_ms is None or self.delivery_timeout_ms > 0,
            "delivery_timeout_ms must be positive, or None to retry forever",
        )
        need(
            protocol.BATCH_HEADER_SIZE + RECORD_OVERHEAD
            < self.batch_bytes_max
            <= protocol.FRAME_BYTES_MAX_DEFAULT // 2,
            "batch_bytes_max is out of range",
        )
        need(1 <= self.batch_records_max <= 1_000_000, "batch_records_max must be 1..1000000")
        need(
            self.buffer_records_max >= self.batch_records_max,
            "buffer_records_max must be at least batch_records_max",
        )
        need(self.request_timeout_ms > 0, "request_timeout_ms must be positive")
        need(
            0 < self.retry_backoff_ms <= self.retry_backoff_max_ms,
            "retry_backoff_ms must be positive and at most retry_backoff_max_ms",
        )


DEFAULTS = ProducerConfig()  # the keyword defaults of AsyncProducer and Producer


@dataclass(frozen=True, kw_only=True, slots=True)
class ProducerSettings:
    """Everything a producer is built from, in one object: what ``AsyncProducer`` and
    ``Producer`` take as keywords (the same for both; ``producer._Settings`` reads them
    into this). ``config`` is checked; None for a clock or ``rng`` means the real one."""

    coordinator_url: str
    topic: str
    config: ProducerConfig
    producer_name: str | None = None  # None: a PID of its own, no takeover
    expire_ms: int | None = None  # the PID's expiry; None: the topic's default
    http_transport: httpx.AsyncBaseTransport | None = None  # the coordinator's (tests)
    api_token: str | None = None
    tls_ca_file: str | None = None
    tls: bool = False
    clock_ms: Callable[[], float] | None = None  # monotonic ms: linger, timeouts, backoff
    wall_ms: Callable[[], float] | None = None  # ms since the epoch: batch timestamps
    rng: random.Random | None = None  # backoff jitter, the round robin's start
