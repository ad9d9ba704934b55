"""Topics as the coordinator manages them: creation (replica assignment over the live
partition servers, one ZooKeeper transaction), changes to the log settings (a
compare-and-set on the topic's znode, which every replica watches), listing and
description (partition states from ZooKeeper, offsets and sizes from each leader's
METADATA).
"""

from __future__ import annotations

import dataclasses
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from coordinator.leaders import LeaderClient
from coordinator.schemas import LOG_SETTINGS
from coordinator.store import Store
from pidlease import errors
from pidlease.errors import CoordinatorUnavailable, InvalidRequest, UnknownTopicOrPartition
from pidlease.wire.cluster import (
    DEDUP_MODES,
    PartitionState,
    TopicSpec,
    topic_name_problem,
    tp_key,
)

log = logging.getLogger("coordinator.topics")

# Compare-and-set attempts for one PATCH: each lost one means another writer changed the
# topic between our read and our write; more than a few in a row is a storm, not bad luck.
ALTER_ATTEMPTS = 10
# What a partition row says before its leader answers, or when the leader does not report
# a value yet (an older server: no log start means nothing was ever deleted).
_UNKNOWN_OFFSETS = {
    "log_start_offset": -1,
    "log_end_offset": -1,
    "high_watermark": -1,
    "size_bytes": -1,
}


def assign_replicas(
    server_ids: list[int], partitions: int, replication_factor: int
) -> list[PartitionState]:
    """Round robin: partition p's replicas are the R servers starting at p mod N, so leaders
    (the first replica) spread evenly. Epoch 0, every replica in sync."""
    n = len(server_ids)
    out = []
    for p in range(partitions):
        replicas = [server_ids[(p + i) % n] for i in range(replication_factor)]
        out.append(
            PartitionState(
                replicas=replicas, leader=replicas[0], leader_epoch=0, isr=list(replicas)
            )
        )
    return out


def _metadata_entry(info: dict[str, Any] | None, topic: str, partition: int) -> Any:
    """One partition's entry of a leader's METADATA blob: a map keyed "topic/partition" or
    a list of entries with topic and partition."""
    if not info:
        return None
    parts = info.get("partitions")
    if isinstance(parts, dict):
        return parts.get(tp_key(topic, partition))
    if isinstance(parts, list):
        return next(
            (
                e
                for e in parts
                if isinstance(e, dict)
                and e.get("topic") == topic
                and e.get("partition") == partition
            ),
            None,
        )
    return None


def _int_or(value: Any, default: int) -> int:
    # bool is an int to Python, never an offset.
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def log_from_metadata(info: dict[str, Any] | None, topic: str, partition: int) -> dict[str, int]:
    """``log_start_offset``, ``log_end_offset``, ``high_watermark`` and ``size_bytes`` of one
    partition from its leader's METADATA blob; all -1 when the leader did not answer or
    does not know the partition. A leader that answers but does not report the log start
    or the size yet gives 0 (nothing was deleted) and -1 (unknown). ``segments_deleted``
    and ``bytes_deleted`` (what retention removed on that leader since its process
    started) are added only when the leader reports them."""
    entry = _metadata_entry(info, topic, partition)
    if not isinstance(entry, dict):
        return dict(_UNKNOWN_OFFSETS)
    leo = _int_or(entry.get("log_end_offset", entry.get("next_offset")), -1)
    hw = _int_or(entry.get("high_watermark", entry.get("high_watermark_offset")), leo)
    out = {
        "log_start_offset": _int_or(entry.get("log_start_offset"), 0),
        "log_end_offset": leo,
        "high_watermark": hw,
        "size_bytes": _int_or(entry.get("size_bytes"), -1),
    }
    for field in ("segments_deleted", "bytes_deleted"):
        value = _int_or(entry.get(field), -1)
        if value >= 0:
            out[field] = value
    return out


def settings_of(spec: TopicSpec) -> dict[str, int]:
    """The log settings as stored, plus the in-sync replica count a 0 stands for."""
    out = {f: getattr(spec, f) for f in LOG_SETTINGS}
    out["min_insync_replicas_effective"] = spec.min_insync
    return out


class Topics:
    def __init__(
        self, store: Store, leaders: LeaderClient, clock_ms: Any, *, metadata_parallelism: int = 8
    ) -> None:
        self.store = store
        self.leaders = leaders
        self.clock_ms = clock_ms
        self._parallelism = metadata_parallelism

    def create(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        dedup: str,
        settings: dict[str, int] | None = None,
    ) -> dict[str, Any]:
        """``settings``: any of LOG_SETTINGS, already range-checked by the schema."""
        problem = topic_name_problem(name)
        if problem:
            raise InvalidRequest(problem)
        if dedup not in DEDUP_MODES:
            raise InvalidRequest(f"dedup must be one of {', '.join(DEDUP_MODES)}")
        live = sorted(s.id for s in self.store.live_servers())
        if replication_factor > len(live):
            raise InvalidRequest(
                f"replication_factor {replication_factor} needs that many live "
                f"partition servers; {len(live)} are live"
            )
        spec = TopicSpec(
            name=name,
            partitions=partitions,
            replication_factor=replication_factor,
            dedup=dedup,
            created_ms=self.clock_ms(),
            **(settings or {}),
        )
        self.store.create_topic(spec, assign_replicas(live, partitions, replication_factor))
        return self.describe(name, with_offsets=False)

    def alter(self, name: str, changes: dict[str, int]) -> dict[str, Any]:
        """Change some of the log settings (``changes``: a non-empty subset of LOG_SETTINGS,
        range-checked by the schema) by compare-and-set on the topic's znode, so a
        concurrent change is never lost; answers the settings as stored afterwards. The
        partition servers watch that znode and apply the new spec without a restart."""
        unknown = sorted(set(changes) - set(LOG_SETTINGS))
        if unknown or not changes:
            raise InvalidRequest(
                f"only {', '.join(LOG_SETTINGS)} can be changed"
                + (f"; not {', '.join(unknown)}" if unknown else "")
            )
        for _ in range(ALTER_ATTEMPTS):
            got = self.store.get_topic_versioned(name)
            if got is None:
                raise UnknownTopicOrPartition(f"topic {name!r} does not exist")
            spec, version = got
            want = changes.get("min_insync_replicas", 0)
            if want > spec.replication_factor:
                raise InvalidRequest(
                    f"min_insync_replicas {want} is more than the topic's replication_factor "
                    f"{spec.replication_factor}"
                )
            new = dataclasses.replace(spec)
            for field, value in changes.items():
                setattr(new, field, value)
            if new == spec or self.store.cas_topic(new, version):
                if new != spec:
                    log.info(
                        "topic %s: %s",
                        name,
                        ", ".join(f"{k} {getattr(spec, k)} -> {v}" for k, v in changes.items()),
                    )
                return {"error": "NONE", "name": name, **settings_of(new)}
        raise CoordinatorUnavailable(
            f"topic {name!r} changed under {ALTER_ATTEMPTS} attempts in a row; retry"
        )

    def list(self) -> list[dict[str, Any]]:
        out = []
        for name in self.store.list_topic_names():
            spec = self.store.get_topic(name)
            if spec is not None:
                out.append(
                    {
                        "name": spec.name,
                        "partitions": spec.partitions,
                        "replication_factor": spec.replication_factor,
                        "dedup": spec.dedup,
                    }
                )
        return out

    def describe(
        self, name: str, *, with_offsets: bool = True, first: int = 0, count: int | None = None
    ) -> dict[str, Any]:
        """The topic and its partitions ``first`` .. ``first + count - 1`` (all by default):
        a page of a topic of thousands (``pidlease topic describe --from --limit``), whose
        offsets then ask only the leaders of that page."""
        spec = self.store.get_topic(name)
        if spec is None:
            raise UnknownTopicOrPartition(f"topic {name!r} does not exist")
        last = spec.partitions if count is None else min(spec.partitions, first + count)
        numbers = list(range(min(first, spec.partitions), last))
        # Without offsets (the producers' and readers' leader lookups, many a second in a
        # failover): the states this coordinator keeps until their znodes change. With
        # offsets (operators, `topic describe`): read from ZooKeeper, as exact as can be.
        states = self.store.get_partition_states(name, numbers, watched=not with_offsets)
        servers = self.store.get_servers(sorted({s.leader for s in states if s is not None}))
        metadata: dict[int, dict[str, Any] | None] = {}
        if with_offsets and servers:
            metadata = self._metadata(servers)
        rows: list[dict[str, Any]] = []
        for p, st in zip(numbers, states, strict=True):
            if st is None:
                rows.append(
                    {
                        "partition": p,
                        "leader": -1,
                        "leader_address": None,
                        "leader_epoch": -1,
                        "replicas": [],
                        "isr": [],
                        **_UNKNOWN_OFFSETS,
                    }
                )
                continue
            info = servers.get(st.leader)
            offsets = (
                log_from_metadata(metadata.get(st.leader), name, p)
                if with_offsets
                else dict(_UNKNOWN_OFFSETS)
            )
            rows.append(
                {
                    "partition": p,
                    "leader": st.leader,
                    "leader_address": info.address if info else None,
                    "leader_epoch": st.leader_epoch,
                    "replicas": st.replicas,
                    "isr": st.isr,
                    **offsets,
                }
            )
        return {
            "error": "NONE",
            "name": spec.name,
            "partitions": spec.partitions,
            "replication_factor": spec.replication_factor,
            "dedup": spec.dedup,
            "created_ms": spec.created_ms,
            **settings_of(spec),
            "partition_states": rows,
            **({} if first == 0 and count is None else {"first_partition": first}),
        }

    def _metadata(self, servers: dict[int, Any]) -> dict[int, dict[str, Any] | None]:
        def one(address: str) -> dict[str, Any] | None:
            try:
                resp = self.leaders.metadata(address)
            except errors.PidleaseError as exc:
                log.info("METADATA from %s failed: %s", address, exc.detail)
                return None
            return resp.info if resp.error_code == errors.NONE else None

        with ThreadPoolExecutor(max_workers=min(self._parallelism, len(servers))) as pool:
            futures = {sid: pool.submit(one, info.address) for sid, info in servers.items()}
            return {sid: f.result() for sid, f in futures.items()}
