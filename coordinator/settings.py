"""The coordinator's typed settings, read from ``PIDLEASE_*`` environment variables.

The settings it shares with the partition server come from
``pidlease.wire.service_settings.ServiceSettings``; docs/settings.md is generated from both.
Every duration is in milliseconds and says so in its name.
"""

from __future__ import annotations

import os
import socket

from pydantic import Field, model_validator

from coordinator.auth import Principal, build_principals
from pidlease.wire.service_settings import ServiceSettings


def default_coordinator_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class CoordinatorSettings(ServiceSettings):
    """The coordinator's own settings; those it shares with the partition server (``zk``,
    ``lease_secret``, ``api_token(s)``, ``tls_*``) are in ``ServiceSettings``."""

    http_host: str = "127.0.0.1"
    http_port: int = Field(default=8470, ge=0, le=65535)
    coordinator_id: str = ""
    # New PIDs one principal may hold (0 = no limit); counted in ZooKeeper per principal.
    pids_max_per_principal: int = Field(default=0, ge=0)

    pid_block_size: int = Field(default=100, ge=1, le=1_000_000)
    topic_replication_factor_default: int = Field(
        default=1,
        ge=1,
        le=16,
        description=(
            "replication factor of a topic created without one (`pidlease dev up "
            "--replication-factor N` sets it); a create still needs that many live servers"
        ),
    )
    lease_expire_ms_default: int = Field(default=60_000, ge=1)
    lease_expire_ms_min: int = Field(default=100, ge=1)
    lease_expire_ms_max: int = Field(default=86_400_000, ge=1)
    pid_retention_ms: int = Field(default=604_800_000, ge=0)
    lease_expiring_window_ms: int = Field(default=30_000, ge=0)
    clock_skew_max_ms: int = Field(
        default=60_000,
        ge=0,
        description=(
            "how far a partition server's clock may lag this coordinator's. A takeover or renewal "
            "that finds no state on a partition where none was reported yet answers UNKNOWN_PID, "
            "not sequence 0, when that partition expired a PID last used after (the partition "
            "joined the lease - this); keep it well below the servers' pid_expire_ms"
        ),
    )
    pid_sweep_interval_ms: int = Field(
        default=600_000,
        ge=10,
        description=(
            "how often PIDs past retention are deleted, by the first live coordinator only; "
            "a sweep reads every PID record, so keep it long next to pid_retention_ms"
        ),
    )

    zk_request_timeout_ms: int = Field(default=5_000, ge=10)
    zk_session_timeout_ms: int = Field(
        default=10_000,
        ge=1_000,
        description=(
            "ZooKeeper session timeout asked for (why it is longer than the partition "
            "server's: see the table below)"
        ),
    )
    leader_request_timeout_ms: int = Field(default=5_000, ge=10)
    leader_connections_max: int = Field(default=8, ge=1, le=1024)
    fence_parallelism_max: int = Field(default=16, ge=1, le=256)

    request_bytes_max: int = Field(default=1_048_576, ge=1024)
    batch_requests_max: int = Field(default=1_000, ge=1)
    pids_list_max: int = Field(default=100_000, ge=1)
    worker_threads: int = Field(default=256, ge=1, le=4096)
    cas_attempts_max: int = Field(default=10_000, ge=1)
    pid_record_cache_max: int = Field(
        default=100_000,
        ge=0,
        description=(
            "PID records this coordinator remembers (record + znode version) so a renewal needs no "
            "ZooKeeper read; every change is still a compare-and-set, so a stale entry only costs "
            "a re-read. 0 turns the cache off"
        ),
    )
    leader_address_cache_ms: int = Field(
        default=1_000,
        ge=0,
        description=(
            "how long a partition's leader address is reused for renewals' PRODUCER_STATE calls "
            "before ZooKeeper is asked again; a wrong entry is dropped at the first NOT_LEADER or "
            "connection error. 0 turns it off"
        ),
    )

    @model_validator(mode="after")
    def _check(self) -> CoordinatorSettings:
        if not self.coordinator_id:
            self.coordinator_id = default_coordinator_id()
        if not (
            self.lease_expire_ms_min <= self.lease_expire_ms_default <= self.lease_expire_ms_max
        ):
            raise ValueError(
                "need lease_expire_ms_min <= lease_expire_ms_default <= lease_expire_ms_max"
            )
        self.principals()  # a malformed api_tokens / api_tokens_file entry stops the start
        return self

    def principals(self) -> list[Principal]:
        """The configured API principals (empty: the API is open)."""
        return build_principals(self.api_token, self.api_tokens, self.api_tokens_file)
