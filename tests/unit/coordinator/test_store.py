"""``Store`` (coordinator/store.py) without ZooKeeper: its session bookkeeping."""

from __future__ import annotations

from kazoo.protocol.states import KazooState


def test_the_coordinators_own_stop_is_not_counted_as_a_session_loss() -> None:
    """Issue 16 (log lines): the coordinator's own stop is not counted as a ZooKeeper session
    loss."""

    from coordinator.store import Store

    lost = Store("unused:2181")
    lost._on_state(KazooState.LOST)
    assert lost.session_losses == 1  # pidlease_zk_session_losses_total
    stopped = Store("unused:2181")
    stopped.stop()
    stopped._on_state(KazooState.LOST)
    assert stopped.session_losses == 0
    lost.stop()
