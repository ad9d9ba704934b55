"""Logged errors carry their text (issue 16: ``set_isr failed: `` and ``reading ZooKeeper
failed ()`` said nothing), and a clean stop logs a clean stop, not a lost session."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from kazoo.exceptions import ConnectionLoss
from kazoo.protocol.states import KazooState

from partition_server.registry import Registry
from pidlease.errors import NotLeader, describe
from pidlease.wire.cluster import PartitionState
from tests.helpers import ManualClock
from tests.sim.zk import partition_zk
from tests.unit.server._replicas import LAG_MS, append, fetch, setup


def test_describe_names_the_type_and_never_comes_out_empty() -> None:
    assert describe(ConnectionLoss()) == "ConnectionLoss()"
    assert describe(TimeoutError()) == "TimeoutError()"
    assert describe(OSError(28, "No space left on device")) == (
        "OSError: [Errno 28] No space left on device"
    )
    assert describe(NotLeader("server 2 leads")) == "NotLeader: server 2 leads"


def test_a_failed_isr_write_logs_what_failed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def go() -> None:
        clock = ManualClock(1_000)
        zk = partition_zk(
            PartitionState([1, 2, 3], 1, 1, [1, 2, 3]), fail_sets=1
        )  # ConnectionLoss()
        part, mgr = setup(tmp_path, clock, [1, 2, 3], zk)
        await append(part, 0)
        await fetch(mgr, part, 2, 1)
        clock.now = 1_000 + LAG_MS + 1
        mgr.check_isr(clock.now)
        for _ in range(20):  # the write goes out with the loop's next turns (bulk path)
            await asyncio.sleep(0)
        part.close()

    with caplog.at_level(logging.WARNING, logger="partition_server.replication"):
        asyncio.run(go())
    failed = [r.getMessage() for r in caplog.records if "set_isr failed" in r.getMessage()]
    assert failed == ["t-0: set_isr failed: ConnectionLoss()"]


def test_a_failed_zookeeper_read_logs_what_failed(caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        reg = Registry("unused:2181", 1)

        def read_all() -> None:
            raise ConnectionLoss  # no text: str() of it is empty

        reg._read_all = read_all  # type: ignore[method-assign,assignment] - a stand-in read
        await asyncio.wait_for(reg.refresh(), 5)
        reg._closed = True  # no retry after the test

    with caplog.at_level(logging.WARNING, logger="partition_server.registry"):
        asyncio.run(go())
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("reading ZooKeeper failed (ConnectionLoss()); keeping the last view")


def test_a_clean_stop_is_not_logged_as_a_lost_session(caplog: pytest.LogCaptureFixture) -> None:
    reg = Registry("unused:2181", 1)
    with caplog.at_level(logging.INFO, logger="partition_server.registry"):
        reg.close()  # no client yet: only the flag a SIGTERM's shutdown sets
        reg._on_state(KazooState.LOST)  # what kazoo says when our own stop ends the session
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "ZooKeeper session closed")
    ]
    assert not reg._session_lost
    caplog.clear()
    live = Registry("unused:2181", 1)
    with caplog.at_level(logging.INFO, logger="partition_server.registry"):
        live._on_state(KazooState.LOST)  # a real loss still warns and re-registers later
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "session lost" in caplog.records[0].getMessage() and live._session_lost


def test_the_coordinators_own_stop_is_not_counted_as_a_session_loss() -> None:
    from coordinator.store import Store

    lost = Store("unused:2181")
    lost._on_state(KazooState.LOST)
    assert lost.session_losses == 1  # pidlease_zk_session_losses_total
    stopped = Store("unused:2181")
    stopped.stop()
    stopped._on_state(KazooState.LOST)
    assert stopped.session_losses == 0
    lost.stop()
