TITLE = "the lease heartbeat was a plain read, which a cut-off ZooKeeper follower keeps answering"
ORIGIN = "issue 23 item 6"
# exists() is answered by the ZooKeeper server the session talks to from its own copy;
# cut off from the quorum, a follower answers for up to syncLimit x tickTime while the
# quorum expires the session and elects another leader: two leaders. The heartbeat now
# syncs (through the quorum's leader) before the read. Needs the simulation's 3-node
# ZooKeeper model (helper "sim": a cut-off follower serving stale reads and failing
# sync/writes); with a one-server fake the search cannot tell the two apart. Also caught
# by tests/unit/server/test_registry.py (a fake follower) and, on a real ensemble, by
# tests/chaos/test_netns_zk_follower_cut.py.
PATCHES = [
    (
        "partition_server/registry.py",
        "                    await loop.run_in_executor(None, zk.sync, path)\n",
        "",
    ),
    (
        "partition_server/registry.py",
        "        if not result.successful() or not synced.successful():",
        "        if not result.successful():",
    ),
]
SEARCH = "sim"
SIM_ARGS = ["--zk3"]
PYTEST = ""
BUDGET = 3000
WHY_NOT_SIM = ""
