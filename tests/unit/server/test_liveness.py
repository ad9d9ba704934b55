"""``LiveServers`` (partition_server/liveness.py): which followers' ZooKeeper sessions ended."""

from __future__ import annotations

from partition_server.liveness import LiveServers


def test_live_servers_gone_means_seen_then_absent() -> None:
    """Issue 16 (follower loss): a server is gone once seen and then absent from /servers."""

    live = LiveServers(me=1)
    assert live.gone() == set()
    live.observe([1, 2])
    live.observe([1, 2, 3])
    live.observe([1, 3])
    assert live.gone() == {2}
    live.observe([3])  # no znode of our own: not a view to act on
    assert live.gone() == {2}
    live.observe([1, 2, 3])  # 2 came back in a new session
    assert live.gone() == set()
    assert LiveServers(me=1).gone() == set()
