"""The cluster state's records (pidlease/wire/cluster.py): ``TopicSpec``."""

from __future__ import annotations

from pidlease.wire.cluster import TopicSpec


def test_the_effective_minimum_comes_from_the_topic() -> None:
    """min_insync_replicas (docs/replication.md): a topic's effective minimum comes from its
    spec."""

    assert [TopicSpec("t", 1, r).min_insync for r in (1, 2, 3, 5)] == [1, 1, 2, 2]
    assert TopicSpec("t", 1, 3, min_insync_replicas=1).min_insync == 1
