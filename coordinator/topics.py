"""Topics as the coordinator manages them: creation (replica assignment over the live
partition servers, one ZooKeeper transaction), listing and description (partition states
from ZooKeeper, offsets from each leader's METADATA).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from coordinator.leaders import LeaderClient
from coordinator.store import Store
from pidlease import errors
from pidlease.errors import InvalidRequest, UnknownTopicOrPartition
from pidlease.wire.cluster import DEDUP_MODES, PartitionState, TopicSpec, topic_name_problem, tp_key

log = logging.getLogger("coordinator.topics")


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


def offsets_from_metadata(
    info: dict[str, Any] | None, topic: str, partition: int
) -> tuple[int, int]:
    """(log_end_offset, high_watermark) for one partition out of a leader's METADATA blob.
    Accepts a map keyed "topic/partition" or a list of entries with topic and partition."""
    if not info:
        return -1, -1
    parts = info.get("partitions")
    entry: Any = None
    if isinstance(parts, dict):
        entry = parts.get(tp_key(topic, partition))
    elif isinstance(parts, list):
        entry = next(
            (
                e
                for e in parts
                if isinstance(e, dict)
                and e.get("topic") == topic
                and e.get("partition") == partition
            ),
            None,
        )
    if not isinstance(entry, dict):
        return -1, -1
    leo = entry.get("log_end_offset", entry.get("next_offset", -1))
    hw = entry.get("high_watermark", entry.get("high_watermark_offset", leo))
    return (leo if isinstance(leo, int) else -1), (hw if isinstance(hw, int) else -1)


class Topics:
    def __init__(
        self, store: Store, leaders: LeaderClient, clock_ms: Any, *, metadata_parallelism: int = 8
    ) -> None:
        self.store = store
        self.leaders = leaders
        self.clock_ms = clock_ms
        self._parallelism = metadata_parallelism

    def create(
        self, name: str, partitions: int, replication_factor: int, dedup: str
    ) -> dict[str, Any]:
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
        )
        self.store.create_topic(spec, assign_replicas(live, partitions, replication_factor))
        return self.describe(name, with_offsets=False)

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

    def describe(self, name: str, *, with_offsets: bool = True) -> dict[str, Any]:
        spec = self.store.get_topic(name)
        if spec is None:
            raise UnknownTopicOrPartition(f"topic {name!r} does not exist")
        states = self.store.get_partition_states(name, list(range(spec.partitions)))
        servers = self.store.get_servers(sorted({s.leader for s in states if s is not None}))
        metadata: dict[int, dict[str, Any] | None] = {}
        if with_offsets and servers:
            metadata = self._metadata(servers)
        rows: list[dict[str, Any]] = []
        for p, st in enumerate(states):
            if st is None:
                rows.append(
                    {
                        "partition": p,
                        "leader": -1,
                        "leader_address": None,
                        "leader_epoch": -1,
                        "replicas": [],
                        "isr": [],
                        "log_end_offset": -1,
                        "high_watermark": -1,
                    }
                )
                continue
            info = servers.get(st.leader)
            leo, hw = offsets_from_metadata(metadata.get(st.leader), name, p)
            rows.append(
                {
                    "partition": p,
                    "leader": st.leader,
                    "leader_address": info.address if info else None,
                    "leader_epoch": st.leader_epoch,
                    "replicas": st.replicas,
                    "isr": st.isr,
                    "log_end_offset": leo,
                    "high_watermark": hw,
                }
            )
        return {
            "error": "NONE",
            "name": spec.name,
            "partitions": spec.partitions,
            "replication_factor": spec.replication_factor,
            "dedup": spec.dedup,
            "created_ms": spec.created_ms,
            "partition_states": rows,
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
