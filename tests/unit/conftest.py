"""Fixtures shared by the unit tests (no servers, no ZooKeeper)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pidlease.testing.fakes import FakeCoordinator, FakePartitionServer, fake_cluster


@pytest.fixture
def fake(request: pytest.FixtureRequest) -> Iterator[tuple[FakePartitionServer, FakeCoordinator]]:
    """(server, coordinator) from ``pidlease.testing.fakes.fake_cluster`` holding the test
    module's ``TOPICS`` (name -> (partitions, dedup mode)); the server stops after the test."""
    with fake_cluster(request.module.TOPICS) as pair:
        yield pair
