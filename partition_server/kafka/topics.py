"""The Kafka admin APIs' writes to ZooKeeper, made as the coordinator makes them, so every
partition server picks them up through its watches as for a topic made over HTTP:

- CreateTopics: spec + one state per partition, one transaction (configs: ``configs.py``);
- CreatePartitions: the spec's partition count raised and the new partitions' states
  created in one transaction, conditional on the spec's version (a concurrent change makes
  it retry); the existing partitions' znodes are not touched;
- AlterConfigs / IncrementalAlterConfigs: a compare-and-set of the spec, as PATCH does;
- DeleteTopics: the topic's znodes removed (partitions, then the topic). Each partition
  server then drops its replicas of it: files, producer state, indexes (``LogManager``).

Replicas are assigned round robin over the live servers (partition p's replicas are the R
servers starting at p mod N), the coordinator's rule. Creation over the Kafka port is
limited to ``PARTITIONS_MAX`` partitions so the transaction stays far below ZooKeeper's
1 MB packet; bigger topics go through ``pidlease topic create``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from partition_server.kafka import configs as configs_mod
from pidlease.wire.cluster import (
    PartitionState,
    TopicSpec,
    partition_path,
    topic_name_problem,
    topic_path,
)
from pidlease.wire.kafka_errors import (
    INVALID_PARTITIONS,
    INVALID_REPLICATION_FACTOR,
    INVALID_TOPIC,
    TOPIC_ALREADY_EXISTS,
    UNKNOWN_TOPIC_OR_PARTITION,
)

PARTITIONS_MAX = 1000


class CreateError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


DEDUP_CONFIG = configs_mod.DEDUP


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
    try:
        dedup, settings = configs_mod.for_create(configs, replication_factor)
    except configs_mod.ConfigError as exc:
        raise CreateError(exc.code, str(exc)) from None
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
        **settings,
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


ALTER_ATTEMPTS = 10
TOPIC_PARTITIONS_MAX = 10_000  # the coordinator's limit for a topic


def _existing_name(name: str) -> None:
    """A name that is not a valid topic name names no topic; checked before it becomes a
    ZooKeeper path ("b/partitions/0" would name a partition's znode, ".." is refused by
    the client library)."""
    if topic_name_problem(name):
        raise CreateError(UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name!r}: not a topic name")


def read_spec(zk: Any, name: str) -> tuple[TopicSpec, int]:
    """(spec, znode version); CreateError(UNKNOWN_TOPIC_OR_PARTITION) when absent."""
    _existing_name(name)
    try:
        raw, stat = zk.get(topic_path(name))
        return TopicSpec.from_bytes(raw), stat.version
    except NoNodeError:
        raise CreateError(UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist") from None
    except (ValueError, TypeError) as exc:  # b"" while being created, or unreadable
        raise CreateError(
            UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} is not readable: {exc}"
        ) from None


def alter(
    zk: Any,
    name: str,
    change: Callable[[TopicSpec], TopicSpec],
    *,
    validate_only: bool = False,
) -> TopicSpec:
    """Blocking: the spec ``change(spec)`` returns, written by compare-and-set (retried when
    another writer got in between). ``change`` raises ConfigError for a bad change."""
    for _ in range(ALTER_ATTEMPTS):
        spec, version = read_spec(zk, name)
        try:
            new = change(spec)
        except configs_mod.ConfigError as exc:
            raise CreateError(exc.code, str(exc)) from None
        if validate_only or new == spec:
            return new
        try:
            zk.set(topic_path(name), new.to_bytes(), version=version)
        except BadVersionError:
            continue
        except NoNodeError:
            raise CreateError(UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} was deleted") from None
        return new
    raise CreateError(-1, f"topic {name!r} changed under {ALTER_ATTEMPTS} attempts; retry")


def add_partitions(
    zk: Any, name: str, count: int, live: list[int], *, validate_only: bool = False
) -> list[PartitionState]:
    """Blocking: raise the topic to ``count`` partitions. The new partitions' replicas follow
    the creation rule (partition p's are the R live servers from p mod N); the existing
    partitions, their logs and their producers' state are not touched. Returns the new
    partitions' states."""
    for _ in range(ALTER_ATTEMPTS):
        spec, version = read_spec(zk, name)
        if count <= spec.partitions:
            raise CreateError(
                INVALID_PARTITIONS,
                f"topic {name!r} has {spec.partitions} partitions; the count can only grow",
            )
        if count - spec.partitions > PARTITIONS_MAX or count > TOPIC_PARTITIONS_MAX:
            raise CreateError(
                INVALID_PARTITIONS,
                f"at most {PARTITIONS_MAX} new partitions at a time and "
                f"{TOPIC_PARTITIONS_MAX} in all",
            )
        if len(live) < spec.replication_factor:
            raise CreateError(
                INVALID_REPLICATION_FACTOR,
                f"replication factor {spec.replication_factor} needs that many live servers; "
                f"{len(live)} are live",
            )
        ids = sorted(live)
        r = spec.replication_factor
        states = [
            PartitionState(
                replicas=(reps := [ids[(p + i) % len(ids)] for i in range(r)]),
                leader=reps[0],
                isr=list(reps),
            )
            for p in range(spec.partitions, count)
        ]
        if validate_only:
            return states
        tx = zk.transaction()
        tx.set_data(
            topic_path(name), dataclasses.replace(spec, partitions=count).to_bytes(), version
        )
        for p, st in enumerate(states, start=spec.partitions):
            tx.create(partition_path(name, p), st.to_bytes())
        results = tx.commit()
        bad = [r for r in results if isinstance(r, Exception)]
        if not bad:
            return states
        if any(isinstance(r, BadVersionError) for r in bad):
            continue
        if any(isinstance(r, NoNodeError) for r in bad):
            raise CreateError(UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
        raise CreateError(-1, f"adding partitions to {name!r} failed: {bad[0]!r}")
    raise CreateError(-1, f"topic {name!r} changed under {ALTER_ATTEMPTS} attempts; retry")


def delete(zk: Any, name: str) -> None:
    """Blocking: remove the topic's znodes, partitions first, then the topic (chunks of
    ``PARTITIONS_MAX`` per transaction). A partition server drops its replicas when the
    topic is gone (``LogManager``); until the last chunk the topic is still listed, with fewer
    partitions (a topic of at most that many partitions goes in one transaction).
    CreateError(UNKNOWN_TOPIC_OR_PARTITION) when it does not exist."""
    _existing_name(name)
    tpath = topic_path(name)
    try:
        raw, _ = zk.get(tpath)
    except NoNodeError:
        raise CreateError(UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist") from None
    if raw == b"":
        raise CreateError(UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} is being created")
    try:
        parts = sorted(zk.get_children(tpath + "/partitions"), key=lambda p: (len(p), p))
    except NoNodeError:
        parts = []
    paths = [f"{tpath}/partitions/{p}" for p in parts] + [f"{tpath}/partitions", tpath]
    for i in range(0, len(paths), PARTITIONS_MAX):
        tx = zk.transaction()
        for path in paths[i : i + PARTITIONS_MAX]:
            tx.delete(path)
        results = tx.commit()
        bad = [r for r in results if isinstance(r, Exception)]
        if bad:
            # all or nothing per transaction: another DeleteTopics (or a change) got in
            raise CreateError(-1, f"deleting {name!r} failed, retry: {bad[0]!r}")
