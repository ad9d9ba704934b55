"""Fixtures shared by the unit tests (no servers, no ZooKeeper).

- ``fake``: a fake partition server and coordinator holding the test module's ``TOPICS``.
- The SDK's unit tests run twice: on the producer's fast path and on its readable path
  (``PIDLEASE_SDK_READABLE_PATH=1``: every send through the owning classes' plain methods;
  see pidlease/client/producer.py). Test ids end in ``[fast]`` or ``[readable]``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from pidlease.client import producer as producer_module
from pidlease.testing.fakes import FakeCoordinator, FakePartitionServer, fake_cluster

# The SDK's tests that run both ways: a module that sets ``SDK_BOTH_PATHS = True`` (the
# layout with folders, tests/unit/client/), or, in the flat layout, test_sdk_*.py and the
# producer's settings; the differential test (client/test_paths.py) picks its paths itself.
_BOTH_WAYS = re.compile(r"test_(sdk_(?!paths\b)\w+|producer_settings)\.py$")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sdk_path" in metafunc.fixturenames and (
        getattr(metafunc.module, "SDK_BOTH_PATHS", False)
        or _BOTH_WAYS.search(metafunc.definition.path.name)
    ):
        metafunc.parametrize("sdk_path", ["fast", "readable"], indirect=True)


@pytest.fixture(autouse=True)
def sdk_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """The producer path this test runs on (None: a test outside the SDK's)."""
    path: str | None = getattr(request, "param", None)
    if path is not None:
        monkeypatch.setattr(producer_module, "READABLE_PATH", path == "readable")
    return path


@pytest.fixture
def fake(request: pytest.FixtureRequest) -> Iterator[tuple[FakePartitionServer, FakeCoordinator]]:
    """(server, coordinator) from ``pidlease.testing.fakes.fake_cluster`` holding the test
    module's ``TOPICS`` (name -> (partitions, dedup mode)); the server stops after the test."""
    with fake_cluster(request.module.TOPICS) as pair:
        yield pair
