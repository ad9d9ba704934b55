"""Options of the chaos suite: ``--chaos-long`` (or ``PIDLEASE_CHAOS_LONG=1``) for longer
runs with more seeds; ``--chaos-seed N`` (or ``PIDLEASE_CHAOS_SEED=N``) replays one seed.
Fixture ``tmpfs_cluster``: a cluster whose server 1 will write to a small tmpfs (full disk).

pytest reads options only from conftests next to the paths on its command line, so the
flags need ``tests/chaos`` (or a file in it) named there; the environment variables work
from anywhere."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fulldisk import mount, umount

from pidlease.testing.devcluster import LocalCluster


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("chaos")
    group.addoption(
        "--chaos-long",
        action="store_true",
        default=False,
        help="run the chaos suite's long form (more seeds, longer runs)",
    )
    group.addoption(
        "--chaos-seed",
        type=int,
        default=None,
        help="replay one chaos seed (same as PIDLEASE_CHAOS_SEED)",
    )


@pytest.fixture
def chaos_long(request: pytest.FixtureRequest) -> bool:
    return bool(
        request.config.getoption("--chaos-long", default=False)
        or os.environ.get("PIDLEASE_CHAOS_LONG")
    )


@pytest.fixture
def chaos_seed(request: pytest.FixtureRequest) -> int | None:
    seed = request.config.getoption("--chaos-seed", default=None)
    if seed is None and os.environ.get("PIDLEASE_CHAOS_SEED"):
        seed = int(os.environ["PIDLEASE_CHAOS_SEED"])
    return seed


@pytest.fixture
def tmpfs_cluster(make_cluster: Any) -> Iterator[tuple[LocalCluster, Path]]:
    """A LocalCluster with no partition server yet, and server 1's data dir on an 8 MiB
    tmpfs (skipped where one cannot be mounted: no ``mount``, or not root). After the test
    the cluster is stopped first (nothing may hold the mount), then the tmpfs unmounted."""
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    cluster: LocalCluster = make_cluster(servers=0)
    data = cluster.data_dir / "server-1" / "data"
    data.mkdir(parents=True)
    r = mount("-t", "tmpfs", "-o", "size=8m", "tmpfs", str(data))
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield cluster, data
    finally:
        cluster.stop()
        u = umount(data)
        assert u.returncode == 0, u.stderr
