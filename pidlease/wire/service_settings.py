"""What the coordinator's and the partition server's settings share: the base class both
derive from (``coordinator/settings.py`` ``CoordinatorSettings``,
``partition_server/settings.py`` ``ServerSettings``). One field here is one environment
variable with one default and one meaning for both services: the ZooKeeper connect string,
the lease-token secret, the API principals, the TLS files.

A setting both services have under the same name but not in this base must say why its
defaults differ in ``DIFFERENT_DEFAULTS``: ``scripts/settings_table.py`` writes each reason
into docs/settings.md and fails (so does tests/unit/repo/test_settings_doc.py) when a shared
name has two defaults and no reason."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# name -> why the coordinator's and the partition server's defaults differ.
DIFFERENT_DEFAULTS = {
    "zk_session_timeout_ms": (
        "the partition server's session is its leadership lease: it bounds how long a dead "
        "server keeps its partitions (most of a failover's pause), so it is short (1,200). A "
        "coordinator's session holds no leadership (only its housekeeping turn), so a short "
        "one would only make a busy coordinator lose it for nothing (10,000). The variable "
        "has the same name for both: set it per process, not in an environment both share"
    ),
}


class ServiceSettings(BaseSettings):
    # hide_input_in_errors: a bad setting's message must not print the tokens and secrets
    # read with it.
    model_config = SettingsConfigDict(
        env_prefix="PIDLEASE_", extra="ignore", hide_input_in_errors=True
    )

    zk: str = Field(
        default="127.0.0.1:2181/pidlease",
        description="ZooKeeper connect string, with the cluster's chroot",
    )
    lease_secret: str = Field(
        default="pidlease-dev-secret",
        description=(
            "HMAC key of lease tokens: the coordinator signs with it, partition servers check "
            "with it; deployments set their own"
        ),
    )
    # Principals (coordinator/auth.py): the coordinator's HTTP API needs one when any is
    # set; the partition server's Kafka listener then requires SASL/PLAIN.
    api_token: str = Field(
        default="",
        description=(
            "the admin principal's token (named `admin`); when any API token is set, every "
            "coordinator /v1 call needs `Authorization: Bearer <token>` and the Kafka listener "
            "requires SASL/PLAIN (user = principal, password = its token)"
        ),
    )
    api_tokens: str = Field(
        default="", description="named principals: `name:scope:token,...` (scope admin|producer)"
    )
    api_tokens_file: str = Field(default="", description="a file of `name:scope:token` lines")

    # TLS (docs/operations.md).
    tls_certfile: str = Field(
        default="",
        description=(
            "PEM certificate (chain) to serve TLS with (the coordinator: HTTPS); with "
            "`tls_keyfile`. Both empty: plaintext. A TLS service also speaks TLS to the "
            "partition servers it calls (FENCE and PRODUCER_STATE, replica fetching)"
        ),
    )
    tls_keyfile: str = Field(default="", description="PEM private key of `tls_certfile`")
    tls_ca_file: str = Field(
        default="",
        description=(
            "CA bundle trusted when calling partition servers over TLS; empty: the system "
            "trust store"
        ),
    )

    @model_validator(mode="after")
    def _check_tls_pair(self) -> Self:
        if bool(self.tls_certfile) != bool(self.tls_keyfile):
            raise ValueError(
                "TLS needs both tls_certfile and tls_keyfile (PIDLEASE_TLS_CERTFILE, "
                "PIDLEASE_TLS_KEYFILE), or neither for plaintext"
            )
        return self

    @property
    def tls(self) -> bool:
        return bool(self.tls_certfile)

    @property
    def secret_bytes(self) -> bytes:
        return self.lease_secret.encode()
