"""A leader whose ZooKeeper server is a follower cut off from the quorum steps down before
a new leader is elected (issue 23 item 6; docs/replication.md, Step-down).

A real 3-node ZooKeeper ensemble and three partition servers, each on a host of its own
(network namespaces, ``pidlease.testing.netns``). Partition server 1 leads an R=3 partition
and talks to one ZooKeeper node only, a follower; the others (servers 2 and 3, the
coordinator, the test's own reads) talk to the other two. The follower is then cut off from
the other two ZooKeeper nodes (nft drops: silence, as in a real partition) while server 1
still reaches it. The cut-off follower keeps answering server 1's reads from its own copy
for up to syncLimit x tickTime (10 s here) while the quorum expires server 1's session
(1.2 s) and elects server 2 or 3: with a heartbeat that only read (``exists``), server 1
kept its lease, and led, for those seconds. Its heartbeat's ``sync`` cannot be answered by
the cut-off follower, so its lease runs out and it steps down before the election.

Skipped, with the reason, where namespaces cannot be made (not root, no ``ip``/``nft``).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from netns_cluster import CHROOT, CLIENT, ZK_PORT, NetCluster, Proc

from pidlease.testing.netns import Network, unavailable
from pidlease.testing.wire import WireClient
from pidlease.testing.zkserver import MAIN_CLASS, SLF4J_JAR, ZK_JAR, four_letter
from pidlease.wire.cluster import PartitionState, partition_path
from tests.helpers import wait_for

WHY_NOT = unavailable() if sys.platform == "linux" else "network namespaces are Linux's"
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"no namespaces: {WHY_NOT}")

ZK_HOSTS = ("zk1", "zk2", "zk3")
TOPIC = "zkcut"


class EnsembleCluster(NetCluster):
    """``NetCluster`` with a 3-node ZooKeeper ensemble, one node per host; server 1 talks
    to ``server1_zk`` only, everyone else to the other two nodes."""

    server1_zk: str = ""

    def zk_address(self, host: str) -> str:
        return f"{self.address(host)}:{ZK_PORT}"

    @property
    def zk_hosts(self) -> str:
        others = [h for h in ZK_HOSTS if h != self.server1_zk]
        return ",".join(self.zk_address(h) for h in others)

    def _zookeeper(self, timeout_s: float) -> None:
        peers = [f"server.{i + 1}={self.address(h)}:2888:3888" for i, h in enumerate(ZK_HOSTS)]
        for i, host in enumerate(ZK_HOSTS):
            zdir = self.data_dir / host
            zdir.mkdir(parents=True, exist_ok=True)
            (zdir / "myid").write_text(f"{i + 1}\n")
            cfg = zdir / "zoo.cfg"
            cfg.write_text(
                "\n".join(
                    [
                        # pidlease.testing.zkserver's ensemble settings: a 250 ms tick,
                        # syncLimit 40 ticks (10 s), sessions as short as asked.
                        "tickTime=250",
                        "initLimit=80",
                        "syncLimit=40",
                        "minSessionTimeout=500",
                        "maxSessionTimeout=40000",
                        f"dataDir={zdir}",
                        f"clientPort={ZK_PORT}",
                        f"clientPortAddress={self.address(host)}",
                        "admin.enableServer=false",
                        "4lw.commands.whitelist=*",
                        "maxClientCnxns=0",
                        *peers,
                    ]
                )
                + "\n"
            )
            argv = [
                "java",
                "-Xmx192m",
                "-cp",
                f"{zdir}:{ZK_JAR}:{SLF4J_JAR}",
                MAIN_CLASS,
                str(cfg),
            ]
            p = Proc(host, host, argv, dict(os.environ), zdir / "zookeeper.log", ZK_PORT)
            self.procs[host] = p
            self.start_proc(p, timeout_s)
        # Server 1's ZooKeeper node: a follower, once the ensemble has a leader.
        modes = wait_for(lambda: (m := self.modes()) and "leader" in m.values() and m, 60)
        self.server1_zk = next(h for h, m in sorted(modes.items()) if m == "follower")

    def modes(self) -> dict[str, str]:
        out = {}
        for h in ZK_HOSTS:
            try:
                text = four_letter(self.address(h), ZK_PORT)
            except OSError:
                continue
            for line in text.splitlines():
                if line.startswith("Mode:"):
                    out[h] = line.split(":", 1)[1].strip()
        return out

    def _server(self, i: int) -> None:
        super()._server(i)
        if i == 1:
            self.procs["s1"].env["PIDLEASE_ZK"] = self.zk_address(self.server1_zk) + CHROOT

    def stop(self) -> None:
        super().stop()
        for h in ZK_HOSTS:
            p = self.procs.get(h)
            if p is not None and p.alive:
                p.proc.terminate()
                p.proc.wait(15)


def state(zk: KazooClient) -> tuple[PartitionState, Any]:
    raw, stat = zk.get(partition_path(TOPIC, 0))
    return PartitionState.from_bytes(raw), stat


def test_a_leader_on_a_cut_off_zookeeper_follower_steps_down_before_the_election(
    tmp_path: Path,
) -> None:
    net = Network([*ZK_HOSTS, "s1", "s2", "s3", CLIENT]).start()
    cluster = EnsembleCluster(net, tmp_path, servers=3)
    try:
        with net.entered(CLIENT):
            cluster.start()
            cluster.create_topic(TOPIC, 1, 3)
            zk = cluster.zk()  # the quorum's side: the two nodes server 1 does not use
            wait_for(lambda: (s := state(zk)[0]).leader == 1 and len(s.isr) == 3, 60, "R=3 on 1")
            s1 = f"{cluster.address('s1')}:8480"
            cut = cluster.server1_zk
            others = [h for h in ZK_HOSTS if h != cut]
            cut_wall = time.time()
            for h in others:
                net.cut(cut, h)
            st, stat = wait_for(
                lambda: (x := state(zk))[0].leader != 1 and x, 30, "a new leader", interval_s=0.05
            )
            elected_wall = stat.mtime / 1000  # the quorum's clock: this machine's
            assert st.leader_epoch == 1
            # Server 1 still reaches its node, which still answers reads: what it says
            # about its leadership comes from its lease only.
            with WireClient(s1, timeout_s=10) as c:
                steps = c.metadata()["step_downs"]["recent"]
            ours = [e for e in steps if e["topic"] == TOPIC and e["epoch"] == 0]
            print(
                f"cut at 0 ({cut} from {others}); epoch 1 written at "
                f"+{elected_wall - cut_wall:.3f} s; server 1's step-downs: "
                + ", ".join(f"+{e['wall_ms'] / 1000 - cut_wall:.3f} s" for e in ours)
            )
            assert ours, (
                "server 1 had not stepped down when the quorum elected another leader: its "
                f"cut-off ZooKeeper node kept its lease alive ({steps})"
            )
            assert ours[0]["wall_ms"] / 1000 < elected_wall
            net.heal()
    finally:
        cluster.stop()
        net.close()
