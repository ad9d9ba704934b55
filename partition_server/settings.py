"""Typed settings of a partition server, read from ``PIDLEASE_*`` environment variables
(those shared with the coordinator: ``pidlease.wire.service_settings``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pidlease.wire.service_settings import ServiceSettings

MiB = 1024 * 1024
# The coordinator's longest lease; a PID's state must outlive any lease of it, or a
# renewing producer could find its state gone (UNKNOWN_PID) while its lease is valid.
LEASE_MAX_MS = 86_400_000


class ServerSettings(ServiceSettings):
    """A partition server's own settings; those it shares with the coordinator (``zk``,
    ``lease_secret``, ``api_token(s)``, ``tls_*``) are in ``ServiceSettings``."""

    server_id: int = Field(default=1, ge=0)
    host: str = "127.0.0.1"
    port: int = Field(default=8480, ge=0, le=65535)
    data_dir: str = "./pidlease-data/server-1"
    fsync: Literal["batch", "interval"] = "interval"
    fsync_interval_ms: int = Field(default=2, ge=0, le=10_000)
    segment_bytes_max: int = Field(default=64 * MiB, ge=4096)
    index_interval_bytes: int = Field(
        default=4096,
        ge=1,
        description=(
            "bytes of log between two entries of a segment's sparse offset and time index: a "
            "read walks about this much from an entry; the index takes 16 bytes an entry"
        ),
    )
    snapshot_interval_batches: int = Field(default=10_000, ge=1)
    snapshot_interval_ms: int = Field(default=30_000, ge=10)
    snapshots_kept: int = Field(
        default=2,
        ge=1,
        description=(
            "snapshot files kept (recovery falls back to an older one when the newest is damaged)"
        ),
    )
    retention_check_ms: int = Field(
        default=30_000,
        ge=10,
        description=(
            "how often each partition's retention (the topic's retention_ms and "
            "retention_bytes) deletes old closed segments"
        ),
    )
    duplicate_batches_kept: int = Field(default=5, ge=1, le=1000)
    pid_expire_ms: int = Field(default=604_800_000, ge=1)
    allow_short_pid_expire: bool = Field(
        default=False,
        description=("allow pid_expire_ms below the coordinator's longest lease (tests only)"),
    )
    pid_expire_check_ms: int = Field(default=1000, ge=10)
    batch_bytes_max: int = Field(default=1 * MiB, ge=64)
    frame_bytes_max: int = Field(default=16 * MiB, ge=1024)
    fetch_bytes_max: int = Field(default=4 * MiB, ge=1024)
    tracked_pids_max_per_partition: int = Field(
        default=1_000_000,
        ge=1,
        description=(
            "most PIDs one partition tracks; a new PID beyond it evicts one idle for "
            "pid_evict_idle_min_ms, or is refused TOO_MANY_PIDS (docs/reliability.md)"
        ),
    )
    pid_evict_idle_min_ms: int = Field(
        default=LEASE_MAX_MS,
        ge=0,
        description=(
            "a PID must be unused this long before it may be evicted to make room for a new one "
            "(strict topics; monotonic evict only after pid_expire_ms); default the coordinator's "
            "longest lease, so no PID with a valid lease is evicted"
        ),
    )
    inflight_requests_max_per_connection: int = Field(default=1000, ge=1)
    # -- metrics (docs/operations.md) --
    metrics_host: str = Field(
        default="",
        description=("address of the HTTP listener for GET /metrics; empty: the same as `host`"),
    )
    metrics_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description=("port of that listener (Prometheus text); 0: no listener"),
    )
    # -- replication (docs/replication.md) --
    zk_session_timeout_ms: int = Field(
        default=1_200,
        ge=200,
        le=120_000,
        description=(
            "ZooKeeper session timeout asked for: how long a dead server keeps /servers/<id>, "
            "so most of a failover's pause. The ZooKeeper server bounds it (minSessionTimeout, "
            "2 x tickTime by default: tickTime 250 or less for the default; "
            "docs/replication.md). Load: kazoo pings every third of it (2.5 a second at 1,200); "
            "a server stalled longer than it loses its session and its leaderships"
        ),
    )
    zk_step_down_margin_ms: int = Field(
        default=300,
        ge=0,
        le=60_000,
        description=(
            "a leader steps down this long before its ZooKeeper session could have expired, "
            "counted from its last confirmed contact (at most half the granted timeout)"
        ),
    )
    zk_heartbeat_interval_ms: int = Field(
        default=200,
        ge=10,
        le=60_000,
        description=(
            "how often a partition server confirms its ZooKeeper session (one read of its "
            "own /servers/<id>: 5 reads a second per server at 200): at most half of the "
            "session timeout minus the margin"
        ),
    )
    controlled_shutdown_timeout_ms: int = Field(
        default=5_000,
        ge=0,
        le=600_000,
        description=(
            "on SIGTERM, how long the server tries to hand each partition it leads to an "
            "in-sync follower before it leaves (0: no handover, the old stop)"
        ),
    )
    preferred_leader_election: bool = Field(
        default=True,
        description=(
            "a leader that is not its partition's preferred replica (the first of the "
            "assignment) hands leadership back to it once it is live and caught up"
        ),
    )
    preferred_leader_settle_ms: int = Field(
        default=3_000,
        ge=0,
        le=3_600_000,
        description=(
            "a leadership lasts at least this long before it is handed to the preferred "
            "replica (no flapping while a restarted server catches up)"
        ),
    )
    replica_lag_time_max_ms: int = Field(
        default=10_000,
        ge=100,
        description=(
            "a follower not caught up with the leader for this long leaves the in-sync set"
        ),
    )
    isr_change_min_interval_ms: int = Field(
        default=1000,
        ge=0,
        le=60_000,
        description=(
            "after a change of a partition's in-sync set, no follower is added back for this "
            "long (removals are never delayed): bounds the ZooKeeper writes of a flapping "
            "follower; 0: no limit"
        ),
    )
    move_fetch_bytes_per_s: int = Field(
        default=16 * MiB,
        ge=0,
        description=(
            "bytes per second this server, as leader, sends to the replicas catching up for "
            "a move (a partition mid-move, the replica not in sync), all of them together; "
            "in-sync followers and other catch-ups are not throttled; 0: no throttle "
            "(Kafka's leader.replication.throttled.rate)"
        ),
    )
    replica_fetch_wait_max_ms: int = Field(
        default=500,
        ge=1,
        le=60_000,
        description=("how long the leader holds a follower's fetch that has everything"),
    )
    replica_fetch_timeout_ms: int = Field(
        default=10_000,
        ge=100,
        description=(
            "a follower's fetch (beyond the wait) or EPOCH_END unanswered this long ends its "
            "session with the leader"
        ),
    )
    replica_fetch_backoff_ms: int = Field(
        default=20,
        ge=1,
        le=60_000,
        description=(
            "first pause before a follower's new fetch session (doubles up to 10x). Short: a "
            "follower that reached the new leader a moment before it took the role "
            "(NOT_LEADER) comes back at once, not after the 10x a dead leader earned"
        ),
    )
    hw_checkpoint_interval_ms: int = Field(
        default=1000,
        ge=10,
        description=("how often replicated partitions' high watermarks are checkpointed to disk"),
    )
    replica_routes: str = Field(
        default="",
        description=(
            "<server id>=<host:port>,...: fetch from that server via this address (a fault proxy "
            "in tests)"
        ),
    )
    # -- address and TLS (docs/operations.md) --
    advertised_host: str = Field(
        default="",
        description=(
            "host registered in ZooKeeper, where clients, coordinators and followers connect; "
            "empty: `host`"
        ),
    )
    advertised_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description=("port registered in ZooKeeper; 0: the port this server listens on"),
    )

    # -- Kafka listener (docs/kafka.md) --
    kafka_port: int = Field(
        default=9092,
        ge=0,
        le=65535,
        description=(
            "port of the Kafka protocol listener (unmodified Kafka clients, and the consumer "
            "group coordinator that `Consumer`, `Processor` and `pidlease mirror` join); 9092 "
            "as Kafka's; 0: no listener (processors then need a static assignment). A second "
            "server on one machine needs its own, as it needs its own `port` (`pidlease dev "
            "up` and LocalCluster pick free ones)"
        ),
    )
    kafka_host: str = Field(
        default="", description="address the Kafka listener binds; empty: the same as `host`"
    )
    kafka_advertised_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description=(
            "Kafka port registered in ZooKeeper and answered in Metadata; 0: the bound port"
        ),
    )
    kafka_pid_block_size: int = Field(
        default=100,
        ge=1,
        le=1_000_000,
        description=(
            "PIDs a server reserves at a time from the cluster's ZooKeeper counter for "
            "InitProducerId (the coordinator's blocks come from the same counter)"
        ),
    )
    kafka_fetch_wait_max_ms: int = Field(
        default=30_000,
        ge=0,
        description="most a Kafka Fetch is held waiting for data, whatever it asks",
    )
    group_offsets_retention_ms: int = Field(
        default=604_800_000,
        ge=1_000,
        description=(
            "Kafka's offsets.retention.minutes: an empty consumer group's committed offsets "
            "(and the group) are deleted once it has been empty and without a commit this "
            "long; in a group with members, those of topics no member subscribes to"
        ),
    )
    group_log_compact_bytes: int = Field(
        default=4 << 20,
        ge=0,
        description=(
            "compaction of the group log: a group coordinator writes a checkpoint of its "
            "groups and offsets once this much (and at least the last checkpoint's size) was "
            "written to a group log partition since the last one, and the segments below it "
            "go on every replica; 0: never (the log keeps every commit)"
        ),
    )
    group_log_segment_bytes: int = Field(
        default=4 << 20,
        ge=4096,
        le=1 << 30,
        description=(
            "segment size of the group log topic, set when a server creates it (compaction "
            "deletes whole segments below a checkpoint)"
        ),
    )

    @model_validator(mode="after")
    def _check(self) -> ServerSettings:
        if self.pid_expire_ms < LEASE_MAX_MS and not self.allow_short_pid_expire:
            raise ValueError(
                f"pid_expire_ms={self.pid_expire_ms} is below the coordinator's lease maximum "
                f"{LEASE_MAX_MS}: a leased PID could lose its state; set "
                "PIDLEASE_ALLOW_SHORT_PID_EXPIRE=1 only for tests"
            )
        if self.batch_bytes_max > self.frame_bytes_max:
            raise ValueError("batch_bytes_max must not exceed frame_bytes_max")
        parse_routes(self.replica_routes)
        lease_ms = self.zk_session_timeout_ms - self.zk_step_down_margin_ms
        if self.zk_step_down_margin_ms * 2 > self.zk_session_timeout_ms:
            raise ValueError("zk_step_down_margin_ms must be at most half zk_session_timeout_ms")
        if self.zk_heartbeat_interval_ms * 2 > lease_ms:
            raise ValueError(
                "zk_heartbeat_interval_ms must be at most half of zk_session_timeout_ms minus "
                "zk_step_down_margin_ms, or leaders step down between two heartbeats"
            )
        if self.tls:
            from pidlease.wire.tls import peer_ssl_context, server_ssl_context

            server_ssl_context(self.tls_certfile, self.tls_keyfile)  # unreadable: clear error now
            peer_ssl_context(self.tls_certfile, self.tls_ca_file)
        return self

    @property
    def routes(self) -> dict[int, str]:
        return parse_routes(self.replica_routes)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def parse_routes(spec: str) -> dict[int, str]:
    """``"1=127.0.0.1:9001,3=127.0.0.1:9003"``: fetch from server 1 via 127.0.0.1:9001 (a
    fault-injection proxy in tests; another network path in a deployment)."""
    out: dict[int, str] = {}
    for part in filter(None, (x.strip() for x in spec.split(","))):
        sid, _, addr = part.partition("=")
        if not sid.strip().isdigit() or ":" not in addr:
            raise ValueError(f"bad replica route {part!r}; expected <server id>=<host:port>")
        out[int(sid)] = addr.strip()
    return out
