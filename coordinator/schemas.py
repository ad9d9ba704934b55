"""The HTTP API's request bodies, validated strictly: "5" is not an int, true is not an int,
5.0 is not an int, unknown fields are refused, and every number has its range. A request
that fails here changes nothing and is answered INVALID_REQUEST by ``app.py``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from coordinator.leases import LeaseRequest
from pidlease.wire.cluster import PRODUCER_NAME_MAX, TOPIC_NAME_MAX, topic_name_problem
from pidlease.wire.protocol import MAX_GENERATION, MAX_PID

INT64_MAX = 2**63 - 1
PARTITION_MAX = 2**31 - 1
TOPIC_PARTITIONS_MAX = 10_000
REPLICATION_FACTOR_MAX = 16


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


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


class TopicBody(_Strict):
    name: str = Field(min_length=1, max_length=TOPIC_NAME_MAX)
    partitions: int = Field(ge=1, le=TOPIC_PARTITIONS_MAX)
    replication_factor: int = Field(1, ge=1, le=REPLICATION_FACTOR_MAX)
    dedup: Literal["strict", "monotonic", "off"] = "strict"

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        problem = topic_name_problem(v)
        if problem:
            raise ValueError(problem)
        return v
