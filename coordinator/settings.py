"""The coordinator's typed settings, read from ``PIDLEASE_*`` environment variables.

One table of names, defaults and meanings lives in ``docs/coordinator.md``; keep the two in
step. Every duration is in milliseconds and says so in its name.
"""

from __future__ import annotations

import os
import socket

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from coordinator.auth import Principal, build_principals


def default_coordinator_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class CoordinatorSettings(BaseSettings):
    # hide_input_in_errors: a bad setting's message must not print the tokens and secrets
    # read with it.
    model_config = SettingsConfigDict(
        env_prefix="PIDLEASE_", extra="ignore", hide_input_in_errors=True
    )

    zk: str = "127.0.0.1:2181/pidlease"
    http_host: str = "127.0.0.1"
    http_port: int = Field(default=8470, ge=0, le=65535)
    coordinator_id: str = ""
    lease_secret: str = "pidlease-dev-secret"  # noqa: S105 - the local-cluster default; deployments set PIDLEASE_LEASE_SECRET
    # When set, every /v1 call needs "Authorization: Bearer <api_token>" (401 otherwise);
    # it is the admin principal named "admin" (coordinator/auth.py).
    api_token: str = ""
    # Named principals "name:scope:token,..." (scope admin|producer), and a file of them.
    api_tokens: str = ""
    api_tokens_file: str = ""
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
            "ZooKeeper session timeout asked for. Longer than the partition server's "
            "(1,200) on purpose: a coordinator's session holds no leadership, so a short one "
            "would only make a busy coordinator lose it (and its housekeeping turn) for "
            "nothing; the variable has the same name for both services, so set it per "
            "process if you set it"
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

    # TLS (docs/operations.md): HTTPS with both files; then partition servers are called over TLS.
    tls_certfile: str = Field(
        default="",
        description=(
            "PEM certificate (chain) to serve HTTPS with; with `tls_keyfile`. Both empty: HTTP. "
            "A TLS coordinator calls the partition servers (FENCE, PRODUCER_STATE) over TLS too"
        ),
    )
    tls_keyfile: str = Field(default="", description="PEM private key of `tls_certfile`")
    tls_ca_file: str = Field(
        default="",
        description=(
            "CA bundle trusted when calling partition servers over TLS; empty: the system store"
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
        if bool(self.tls_certfile) != bool(self.tls_keyfile):
            raise ValueError(
                "HTTPS needs both tls_certfile and tls_keyfile (PIDLEASE_TLS_CERTFILE, "
                "PIDLEASE_TLS_KEYFILE), or neither for HTTP"
            )
        self.principals()  # a malformed api_tokens / api_tokens_file entry stops the start
        return self

    def principals(self) -> list[Principal]:
        """The configured API principals (empty: the API is open)."""
        return build_principals(self.api_token, self.api_tokens, self.api_tokens_file)

    @property
    def secret_bytes(self) -> bytes:
        return self.lease_secret.encode()
