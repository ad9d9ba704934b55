"""Which partition servers have left the cluster, as the leader's in-sync check needs to
know (docs/replication.md, "The in-sync set": a lost follower).

A server is live while its ephemeral ``/servers/<id>`` znode exists, that is while its
ZooKeeper session does. The registry re-reads the children of ``/servers`` on every change
(a one-shot watch it re-arms), so the leader hears of a session's end within a read of it.
A vanished session is definite, unlike a slow fetch: the follower is gone for good (a
restart is a new session and a new znode), so its partitions need not wait out
``replica_lag_time_max_ms`` for it.

Only a server this process has seen registered and then not is gone. A replica absent
from the first reads may simply not have registered yet (the whole cluster starting at
once): it is left to the lag rule, as before. Nor is anything gone in a view without
this server's own znode: that read was made outside a session of ours (just lost or not
yet re-registered), when the leader is stepping down anyway.

Pure: the caller feeds it the live ids from each read of the assignment.
"""

from __future__ import annotations

from collections.abc import Iterable


class LiveServers:
    def __init__(self, me: int) -> None:
        self.me = me
        self.seen: set[int] = set()  # registered in some read since this process started
        self.live: set[int] | None = None  # the last trusted read; None: none yet

    def observe(self, live: Iterable[int]) -> None:
        """One read of ``/servers``: ignored when it lacks our own znode (see above)."""
        ids = set(live)
        if self.me not in ids:
            return
        self.live = ids
        self.seen |= ids

    def gone(self) -> set[int]:
        """Servers seen registered earlier and absent from the last trusted read."""
        if self.live is None:
            return set()
        return self.seen - self.live
