"""The data source's options, parsed once into typed settings.

Spark passes options as a case-insensitive map of strings; ``WriteSettings.parse`` and
``ReadSettings.parse`` turn them into typed, checked values (the unit is in the name, as
everywhere in pidlease) and say which option is wrong. The table in docs/pipeline.md lists
every option with its default.

The fault options (``fail_after_rows_once``, ``speculate_partition``, ``kill_*``) exist
for tests and demos of exactly-once; they are off unless given (see ``pidlease.spark.faults``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from pidlease.client.lease_client import DEFAULT_COORDINATOR
from pidlease.spark.errors import OptionError
from pidlease.spark.sequencing import BUCKETS_DEFAULT, BUCKETS_MAX, Routing

COORDINATOR_ENV = "PIDLEASE_COORDINATOR"
SPLIT_RECORDS_DEFAULT = 250_000


def _get(options: Mapping[str, str], name: str) -> str | None:
    # Spark's CaseInsensitiveDict lowers keys; a plain dict from a test may not.
    for k, v in options.items():
        if k.lower() == name:
            return None if v is None else str(v)
    return None


def _int(
    options: Mapping[str, str],
    name: str,
    default: int | None,
    *,
    low: int = 0,
    high: int = 2**63 - 1,
) -> int | None:
    raw = _get(options, name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option {name}={raw!r} must be an integer") from None
    if not low <= value <= high:
        raise OptionError(f"option {name}={value} must be in {low}..{high}")
    return value


def _ints(options: Mapping[str, str], name: str) -> frozenset[int] | None:
    raw = _get(options, name)
    if raw is None or raw.strip() in ("", "all", "*"):
        return None
    try:
        return frozenset(int(x) for x in raw.split(",") if x.strip())
    except ValueError:
        raise OptionError(
            f"option {name}={raw!r} must be a comma-separated list of integers"
        ) from None


def coordinator_url(options: Mapping[str, str]) -> str:
    return _get(options, "coordinator") or os.environ.get(COORDINATOR_ENV) or DEFAULT_COORDINATOR


def _topic(options: Mapping[str, str]) -> str:
    topic = _get(options, "topic")
    if not topic:
        raise OptionError("option topic is required: .option('topic', 'orders')")
    return topic


@dataclass(frozen=True, slots=True)
class Faults:
    """Injected faults (tests and demos). See ``pidlease.spark.faults``."""

    fail_after_rows_once: int | None = None  # attempt 0 fails before this row position
    fail_partitions: frozenset[int] | None = None  # which Spark partitions (None: all)
    speculate_partition: int | None = None  # run a speculative twin of this partition
    speculate_after_rows: int | None = None  # ... started at this row (None: half)
    kill_batch_id: int | None = None  # streaming: every attempt of this batch dies
    kill_at_row: int = 0  # ... before this row position
    kill_commit_batch_id: int | None = None  # streaming: commit of this batch fails
    stall_partition: int | None = None  # attempt 0 of this Spark partition stalls ...
    stall_at_row: int = 0  # ... before this row position ...
    stall_s: float = 0.0  # ... this long (a real cluster's speculation, or a kill, meanwhile)
    stall_marker: str | None = None  # ... after appending "<pid> <partition>" to this file

    @classmethod
    def parse(cls, o: Mapping[str, str]) -> Faults:
        return cls(
            fail_after_rows_once=_int(o, "fail_after_rows_once", None),
            fail_partitions=_ints(o, "fail_partitions"),
            speculate_partition=_int(o, "speculate_partition", None),
            speculate_after_rows=_int(o, "speculate_after_rows", None),
            kill_batch_id=_int(o, "kill_batch_id", None),
            kill_at_row=_int(o, "kill_at_row", 0) or 0,
            kill_commit_batch_id=_int(o, "kill_commit_batch_id", None),
            stall_partition=_int(o, "stall_partition", None),
            stall_at_row=_int(o, "stall_at_row", 0) or 0,
            stall_s=(_int(o, "stall_ms", 0, high=3_600_000) or 0) / 1000,
            stall_marker=_get(o, "stall_marker") or None,
        )


@dataclass(frozen=True, slots=True)
class WriteSettings:
    coordinator: str
    topic: str
    job_name: str | None  # None (streaming only): "stream-<query id>"
    key_column: str | None = None
    routing: Routing = Routing.AUTO
    linger_ms: int = 5
    max_in_flight: int = 5
    batch_records_max: int = 2000
    expire_ms: int | None = None
    api_token: str | None = None
    report_path: str | None = None
    log_report: bool = True  # also log the report line (the command prints it itself)
    faults: Faults = field(default_factory=Faults)
    buckets: int = BUCKETS_DEFAULT  # the bucket count (pidlease.spark.bucketed records it)
    # the rows carry pidlease.spark.bucketed's columns; False: a plain DataFrame, each Spark
    # partition one bucket (producer "<job>:<partition>"), set by the sink's plan
    bucketed: bool = True

    @classmethod
    def parse(cls, o: Mapping[str, str], *, streaming: bool = False) -> WriteSettings:
        job = _get(o, "job_name")
        if not job and not streaming:
            raise OptionError(
                "option job_name is required for a batch write: it names the "
                "producers, so a re-run of the same job appends nothing twice"
            )
        if job is not None and ("\n" in job or len(job) > 200):
            raise OptionError("option job_name must be one line of at most 200 characters")
        raw_routing = (_get(o, "partitioning") or "auto").lower()
        try:
            routing = Routing(raw_routing)
        except ValueError:
            raise OptionError(
                f"option partitioning={raw_routing!r} must be auto, spark or key"
            ) from None
        return cls(
            coordinator=coordinator_url(o),
            topic=_topic(o),
            job_name=job or None,
            key_column=_get(o, "key_column") or None,
            routing=routing,
            linger_ms=_int(o, "linger_ms", 5, high=60_000) or 0,
            max_in_flight=_int(o, "max_in_flight", 5, low=1, high=100) or 5,
            batch_records_max=_int(o, "batch_records_max", 2000, low=1, high=100_000) or 2000,
            expire_ms=_int(o, "expire_ms", None, low=1),
            api_token=_get(o, "api_token") or None,
            report_path=_get(o, "report_path") or None,
            log_report=(_get(o, "log_report") or "true").lower() not in ("false", "0", "no"),
            faults=Faults.parse(o),
            buckets=_int(o, "buckets", BUCKETS_DEFAULT, low=1, high=BUCKETS_MAX) or BUCKETS_DEFAULT,
        )


@dataclass(frozen=True, slots=True)
class ReadSettings:
    coordinator: str
    topic: str
    split_records: int = SPLIT_RECORDS_DEFAULT
    api_token: str | None = None

    @classmethod
    def parse(cls, o: Mapping[str, str]) -> ReadSettings:
        return cls(
            coordinator=coordinator_url(o),
            topic=_topic(o),
            split_records=_int(o, "split_records", SPLIT_RECORDS_DEFAULT, low=1) or 1,
            api_token=_get(o, "api_token") or None,
        )
