"""Shared fixtures. Integration tests get a real ZooKeeper (one per session, started by
the project's own zkserver module on 127.0.0.1), their own chroot in it and their own data
dir; when a test fails, the logs of every process it started are printed."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pidlease.testing.devcluster import LocalCluster
from pidlease.testing.zkserver import ZooKeeperCluster

_chroots = itertools.count(1)


def pytest_addoption(parser: pytest.Parser) -> None:
    # Here, not in tests/sim/conftest.py: pytest reads options only from conftests next to
    # the paths on its command line, and the flag should work with `pytest tests`.
    parser.getgroup("sim").addoption(
        "--sim-long",
        action="store_true",
        default=False,
        help="run the deterministic simulation's long form (tests/sim; PIDLEASE_SIM_LONG=1)",
    )


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):  # type: ignore[no-untyped-def]
    rep = yield
    setattr(item, "rep_" + rep.when, rep)
    return rep


def _failed(request: pytest.FixtureRequest) -> bool:
    rep = getattr(request.node, "rep_call", None)
    return rep is None or rep.failed


@pytest.fixture(scope="session")
def zookeeper() -> Iterator[ZooKeeperCluster]:
    base = Path(tempfile.mkdtemp(prefix="pidlease-zk-"))
    zk = ZooKeeperCluster(base, 1).start()
    yield zk
    zk.stop()
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def zk_hosts(zookeeper: ZooKeeperCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """Hosts string with a chroot of this test's own."""
    hosts = f"{zookeeper.hosts}/t{os.getpid()}-{next(_chroots)}"
    yield hosts
    if _failed(request):
        print(zookeeper.tail_logs(40))


@pytest.fixture
def make_cluster(zk_hosts: str, tmp_path: Path, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """Factory for a LocalCluster on the session ZooKeeper; stopped after the test."""
    made: list[LocalCluster] = []

    def factory(**kw: object) -> LocalCluster:
        kw.setdefault("zk_hosts", zk_hosts)
        c = LocalCluster(tmp_path / f"cluster{len(made)}", **kw)  # type: ignore[arg-type]
        made.append(c)
        return c.start()

    yield factory
    for c in made:
        if _failed(request):
            print(c.logs())
        c.stop()


@pytest.fixture(scope="module")
def make_module_cluster(zookeeper: ZooKeeperCluster, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """``make_cluster`` for a cluster that a module's tests share (the fuzz suites, the
    malformed-request table): on the session ZooKeeper with a chroot of its own, stopped
    after the module's last test."""
    made: list[LocalCluster] = []

    def factory(**kw: object) -> LocalCluster:
        kw.setdefault("zk_hosts", f"{zookeeper.hosts}/m{os.getpid()}-{next(_chroots)}")
        c = LocalCluster(tmp_path_factory.mktemp("cluster"), **kw)  # type: ignore[arg-type]
        made.append(c)
        return c.start()

    yield factory
    for c in made:
        c.stop()
