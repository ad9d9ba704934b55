"""The workload every system runs, what one producer reports, and how reports add up.

A run is ``producers`` producers, each sending ``records`` records of ``value_bytes``
bytes, every one acknowledged (pass 1, "produce"); then the same records sent again, all
of which the system must recognise as duplicates (pass 2, "resend"). Each producer is a
separate process (``runner.py``) so one client's interpreter never limits another's.

Ack latency is sampled (every ``LATENCY_EVERY``-th record) from the moment the record is
handed to the client library until its acknowledgement is seen, so sampling costs the
client almost nothing.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

LATENCY_EVERY = 64
BATCH_BYTES_MAX = 512 * 1024  # the SDK's default batch_bytes_max; the ceiling uses it too
BATCH_RECORDS_MAX = 1000


def records_per_batch(value_bytes: int) -> int:
    """How many records the SDK puts in one batch at its defaults (8 bytes of record head)."""
    return max(1, min(BATCH_RECORDS_MAX, (BATCH_BYTES_MAX - 64) // (value_bytes + 8)))


def payload(value_bytes: int, producer: int) -> bytes:
    """Incompressible bytes, different per producer (nothing in the path compresses, but
    no system should be able to profit from identical records)."""
    return (
        os.urandom(value_bytes - 8) + producer.to_bytes(8, "big")
        if value_bytes >= 8
        else os.urandom(value_bytes)
    )


def clock() -> float:
    """Monotonic seconds, comparable across processes on Linux (CLOCK_MONOTONIC)."""
    return time.monotonic()


@dataclass
class Outcome:
    """What one producer saw in one pass."""

    producer: int
    records: int
    acked: int = 0  # acknowledged as newly written
    duplicates: int = 0  # acknowledged as already written
    errors: int = 0  # anything else (a pass with errors is reported, not hidden)
    error_sample: str = ""
    started: float = 0.0  # clock() when the first record was handed over
    finished: float = 0.0  # clock() when the last acknowledgement was seen
    client_cpu_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class PassResult:
    """A pass summed over producers (wall time from the first start to the last ack)."""

    records: int
    acked: int
    duplicates: int
    errors: int
    error_sample: str
    seconds: float
    records_per_s: float
    p50_ms: float
    p99_ms: float
    client_cpu_s: float


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))]


def summarize(outcomes: list[Outcome]) -> PassResult:
    records = sum(o.records for o in outcomes)
    secs = max(o.finished for o in outcomes) - min(o.started for o in outcomes)
    lat = [x for o in outcomes for x in o.latencies_s]
    sample = next((o.error_sample for o in outcomes if o.error_sample), "")
    return PassResult(
        records,
        sum(o.acked for o in outcomes),
        sum(o.duplicates for o in outcomes),
        sum(o.errors for o in outcomes),
        sample,
        secs,
        records / secs if secs > 0 else float("nan"),
        percentile(lat, 0.5) * 1000,
        percentile(lat, 0.99) * 1000,
        sum(o.client_cpu_s for o in outcomes),
    )
