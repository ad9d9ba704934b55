"""CreateTopics from a Kafka client: the topic written to ZooKeeper as the coordinator
writes it (spec + one state per partition, one transaction), so every partition server
picks it up through its watches as for a topic made over HTTP.

Replicas are assigned round robin over the live servers (partition p's replicas are the R
servers starting at p mod N), the coordinator's rule. Creation over the Kafka port is
limited to ``PARTITIONS_MAX`` partitions so the transaction stays far below ZooKeeper's
1 MB packet; bigger topics go through ``pidlease topic create``.
"""

from __future__ import annotations

import time
from typing import Any

from kazoo.exceptions import NodeExistsError

from pidlease.wire.cluster import (
    PartitionState,
    TopicSpec,
    partition_path,
    topic_name_problem,
    topic_path,
)

PARTITIONS_MAX = 1000
# Kafka error codes CreateTopics answers with.
TOPIC_ALREADY_EXISTS = 36
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38
INVALID_TOPIC = 17
INVALID_CONFIG = 40


class CreateError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


DEDUP_CONFIG = "pidlease.dedup"  # a topic config a Kafka client may pass: strict|monotonic|off


def plan(
    name: str,
    partitions: int,
    replication_factor: int,
    live: list[int],
    configs: dict[str, str | None],
) -> tuple[TopicSpec, list[PartitionState]]:
    """The spec and partition states to write, or CreateError. ``-1`` for partitions or
    replication factor means the default: 1 partition, min(3, live servers) replicas."""
    problem = topic_name_problem(name)
    if problem:
        raise CreateError(INVALID_TOPIC, problem)
    if partitions == -1:
        partitions = 1
    if not 1 <= partitions <= PARTITIONS_MAX:
        raise CreateError(INVALID_PARTITIONS, f"partitions must be 1..{PARTITIONS_MAX}")
    if replication_factor == -1:
        replication_factor = min(3, len(live))
    if not 1 <= replication_factor <= len(live):
        raise CreateError(
            INVALID_REPLICATION_FACTOR,
            f"replication factor {replication_factor} needs that many live servers; "
            f"{len(live)} are live",
        )
    dedup = configs.get(DEDUP_CONFIG) or "strict"
    unknown = sorted(k for k in configs if k != DEDUP_CONFIG)
    if unknown or dedup not in ("strict", "monotonic", "off"):
        raise CreateError(
            INVALID_CONFIG,
            f"only {DEDUP_CONFIG} (strict|monotonic|off) may be set here; "
            "other settings: pidlease topic create / PATCH /v1/topics",
        )
    ids = sorted(live)
    states = []
    for p in range(partitions):
        replicas = [ids[(p + i) % len(ids)] for i in range(replication_factor)]
        states.append(PartitionState(replicas=replicas, leader=replicas[0], isr=list(replicas)))
    spec = TopicSpec(
        name=name,
        partitions=partitions,
        replication_factor=replication_factor,
        dedup=dedup,
        created_ms=int(time.time() * 1000),
    )
    return spec, states


def create(zk: Any, spec: TopicSpec, states: list[PartitionState]) -> None:
    """Blocking: one transaction. CreateError(TOPIC_ALREADY_EXISTS) when it exists."""
    tx = zk.transaction()
    tx.create(topic_path(spec.name), spec.to_bytes())
    tx.create(topic_path(spec.name) + "/partitions", b"")
    for p, st in enumerate(states):
        tx.create(partition_path(spec.name, p), st.to_bytes())
    results = tx.commit()
    bad = [r for r in results if isinstance(r, Exception)]
    if any(isinstance(r, NodeExistsError) for r in bad):
        raise CreateError(TOPIC_ALREADY_EXISTS, f"topic {spec.name!r} already exists")
    if bad:
        raise CreateError(-1, f"creating {spec.name!r} failed: {bad[0]!r}")
