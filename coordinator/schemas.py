"""The HTTP API's request bodies, validated strictly: "5" is not an int, true is not an int,
5.0 is not an int, unknown fields are refused, and every number has its range. A request
that fails here changes nothing and is answered INVALID_REQUEST by ``app.py``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from coordinator.leases import LeaseRequest
from pidlease.wire.cluster import LOG_SETTINGS as _LOG_SETTINGS
from pidlease.wire.cluster import (
    PRODUCER_NAME_MAX,
    RETENTION_MS_DEFAULT,
    SEGMENT_BYTES_MAX,
    SEGMENT_MS_DEFAULT,
    TOPIC_NAME_MAX,
    log_setting_problem,
    topic_name_problem,
)
from pidlease.wire.protocol import MAX_GENERATION, MAX_PID

# The topic settings that may change after creation; defined with their checks in
# pidlease/wire/cluster.py (the Kafka listener's configs use them too), named here for
# the HTTP API.
LOG_SETTINGS = _LOG_SETTINGS

INT64_MAX = 2**63 - 1
PARTITION_MAX = 2**31 - 1
TOPIC_PARTITIONS_MAX = 10_000
REPLICATION_FACTOR_MAX = 16


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class MovesBody(_Strict):
    dry_run: bool = Field(False, description="only plan: print the moves, change nothing")
    rollback_after_s: float = Field(
        30.0,
        ge=0,
        le=86_400,
        description="a move whose new server is not live this long goes back to where it was",
    )


class LeaseBody(_Strict):
    topic: str = Field(min_length=1, max_length=TOPIC_NAME_MAX)
    partition: int = Field(ge=0, le=PARTITION_MAX)
    pid: int = Field(ge=-1, le=MAX_PID, description="-1 asks for a new PID (or a takeover by name)")
    expire_ms: int | None = Field(
        None, ge=1, le=INT64_MAX, description="clamped to the server's [min, max]"
    )
    generation: int | None = Field(None, ge=0, le=MAX_GENERATION)
    producer_name: str | None = Field(None, min_length=1, max_length=PRODUCER_NAME_MAX)

    @field_validator("topic")
    @classmethod
    def _topic(cls, v: str) -> str:
        problem = topic_name_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("pid")
    @classmethod
    def _pid(cls, v: int) -> int:
        if v == 0:
            raise ValueError(
                "pid 0 means 'not idempotent' and is never leased; use -1 for a new PID"
            )
        return v

    @field_validator("producer_name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        # "." and ".." cannot be ZooKeeper node names, even once percent-quoted.
        if v in (".", ".."):
            raise ValueError("producer_name may not be '.' or '..'")
        return v

    @model_validator(mode="after")
    def _generation_needs_pid(self) -> LeaseBody:
        if self.generation is not None and self.pid == -1:
            raise ValueError("generation is only meaningful with a pid; a new lease gets one")
        return self

    def to_request(self) -> LeaseRequest:
        return LeaseRequest(
            topic=self.topic,
            partition=self.partition,
            pid=self.pid,
            expire_ms=self.expire_ms,
            generation=self.generation,
            producer_name=self.producer_name,
        )


class LeaseBatchBody(_Strict):
    requests: list[LeaseBody] = Field(min_length=1)


_RETENTION_MS = "-1 keeps forever"
_RETENTION_BYTES = "per partition; -1 is no limit"
_SEGMENT_BYTES = "0 is the server's segment_bytes_max; else 4096..1 GiB"
_SEGMENT_MS = "an active segment this old rolls; -1 never"
_MIN_INSYNC = "0 is the default (1 for R <= 2, 2 for R >= 3); else 1..replication_factor"


class _LogSettingsChecks(_Strict):
    """The checks the five log settings share between creation and PATCH."""

    @field_validator(*LOG_SETTINGS, check_fields=False)
    @classmethod
    def _log_setting(cls, v: int | None, info: ValidationInfo) -> int | None:
        problem = None if v is None else log_setting_problem(str(info.field_name), v)
        if problem:
            raise ValueError(problem)
        return v


class TopicBody(_LogSettingsChecks):
    name: str = Field(min_length=1, max_length=TOPIC_NAME_MAX)
    partitions: int = Field(ge=1, le=TOPIC_PARTITIONS_MAX)
    # None: the coordinator's topic_replication_factor_default.
    replication_factor: int | None = Field(None, ge=1, le=REPLICATION_FACTOR_MAX)
    dedup: Literal["strict", "monotonic", "off"] = "strict"
    retention_ms: int = Field(RETENTION_MS_DEFAULT, ge=-1, le=INT64_MAX, description=_RETENTION_MS)
    retention_bytes: int = Field(-1, ge=-1, le=INT64_MAX, description=_RETENTION_BYTES)
    segment_bytes: int = Field(0, ge=0, le=SEGMENT_BYTES_MAX, description=_SEGMENT_BYTES)
    segment_ms: int = Field(SEGMENT_MS_DEFAULT, ge=-1, le=INT64_MAX, description=_SEGMENT_MS)
    min_insync_replicas: int = Field(0, ge=0, le=REPLICATION_FACTOR_MAX, description=_MIN_INSYNC)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        problem = topic_name_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @model_validator(mode="after")
    def _min_insync_fits(self) -> TopicBody:
        if self.replication_factor is not None and (
            self.min_insync_replicas > self.replication_factor
        ):
            raise ValueError(
                f"min_insync_replicas {self.min_insync_replicas} is more than "
                f"replication_factor {self.replication_factor}"
            )
        return self

    def log_settings(self) -> dict[str, int]:
        return {f: getattr(self, f) for f in LOG_SETTINGS}


class TopicAlterBody(_LogSettingsChecks):
    """``PATCH /v1/topics/{name}``: the settings to change; a field left out keeps its
    value. Other topic fields are refused before this model sees them (``app.py``), with
    a 400 that says they are fixed."""

    retention_ms: int | None = Field(None, ge=-1, le=INT64_MAX, description=_RETENTION_MS)
    retention_bytes: int | None = Field(None, ge=-1, le=INT64_MAX, description=_RETENTION_BYTES)
    segment_bytes: int | None = Field(None, ge=0, le=SEGMENT_BYTES_MAX, description=_SEGMENT_BYTES)
    segment_ms: int | None = Field(None, ge=-1, le=INT64_MAX, description=_SEGMENT_MS)
    min_insync_replicas: int | None = Field(
        None, ge=0, le=REPLICATION_FACTOR_MAX, description=_MIN_INSYNC
    )

    @field_validator(*LOG_SETTINGS, mode="before")
    @classmethod
    def _not_null(cls, v: object) -> object:
        # null would read as "left out": say so instead of silently changing nothing.
        if v is None:
            raise ValueError("null is not a setting; leave the field out to keep its value")
        return v

    def changes(self) -> dict[str, int]:
        return {f: v for f in LOG_SETTINGS if (v := getattr(self, f)) is not None}
