"""The nemeses of the namespace suite (netns_suite.py): what each one cuts, and how it is
healed. Each acts on partition 0's leader or its followers as they are when it starts
(``Target``); ``heal`` may return a note for the report (the delayer's packet counts).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from netns_cluster import NetCluster

from pidlease.testing.netns import Network

DELAY_QUEUE = 7
HERE = Path(__file__).resolve().parent


# -- nemeses -------------------------------------------------------------------------------
@dataclass
class Target:
    leader: str  # host of partition 0's leader when the nemesis starts
    followers: list[str]
    leader_id: int


@dataclass
class Nemesis:
    name: str
    what: str
    inject: Callable[[Network, NetCluster, Target], None]
    heal: Callable[[Network, NetCluster, Target], str | None]  # a note for the report
    moves_leader: bool = False
    min_isr_check: bool = False
    count_isr_writes: bool = False


def _heal(net: Network, c: NetCluster, t: Target) -> None:
    net.heal()


def _restart_leader(net: Network, c: NetCluster, t: Target) -> None:
    c.start_proc(c.procs[t.leader])


class Delayer:
    proc: subprocess.Popen[bytes] | None = None


def _start_delay(net: Network, c: NetCluster, t: Target) -> None:
    net.queue(t.leader, DELAY_QUEUE)
    # 100 ms each way (out and in through the queue): 200 ms more on every round trip.
    argv = [sys.executable, str(HERE / "netns_delay.py"), "--queue", str(DELAY_QUEUE)]
    argv += ["--delay-ms", "100", "--loss", "0.1", "--seed", "7"]
    with open(c.data_dir / "delayer.log", "ab") as log:
        Delayer.proc = net.popen(t.leader, argv, env=dict(os.environ), log=log)


def _stop_delay(net: Network, c: NetCluster, t: Target) -> str:
    if Delayer.proc is not None:
        Delayer.proc.terminate()
        Delayer.proc.wait(10)
        Delayer.proc = None
    net.heal()
    # Its last line, e.g. "delayer counts {'seen': 3288, 'dropped': 336, 'passed': 2940}":
    # proof that the leader's packets did go through it.
    lines = (c.data_dir / "delayer.log").read_text(errors="replace").splitlines()
    return lines[-1] if lines else "the delayer wrote nothing"


NEMESES: dict[str, Nemesis] = {
    n.name: n
    for n in [
        Nemesis(
            "isolate_leader",
            "partition 0's leader's link down (it hears no one, no one hears it)",
            lambda net, c, t: net.link(t.leader, up=False),
            _heal,
            moves_leader=True,
        ),
        Nemesis(
            "leader_zk_cut",
            "partition 0's leader cut from ZooKeeper only (clients and followers reach it)",
            lambda net, c, t: net.cut(t.leader, "zk"),
            _heal,
            moves_leader=True,
        ),
        Nemesis(
            "split_leader_zk",
            "{leader, ZooKeeper} | {followers}, min_insync_replicas 2",
            lambda net, c, t: net.split([t.leader, "zk"], t.followers),
            _heal,
            min_isr_check=True,
        ),
        Nemesis(
            "isolate_follower",
            "one follower of partition 0 with its link down",
            lambda net, c, t: net.link(t.followers[0], up=False),
            _heal,
            count_isr_writes=True,
        ),
        Nemesis(
            "one_way_leader_to_follower",
            "frames from partition 0's leader to one follower dropped (the other way passes)",
            lambda net, c, t: net.cut(t.leader, t.followers[0], one_way=True),
            _heal,
        ),
        Nemesis(
            "one_way_zk_to_leader",
            "frames from ZooKeeper to partition 0's leader dropped (its pings arrive)",
            lambda net, c, t: net.cut("zk", t.leader, one_way=True),
            _heal,
            moves_leader=True,
        ),
        Nemesis(
            "delay_loss_leader",
            "partition 0's leader's link: +200 ms round trip (NFQUEUE delayer), 10 % loss",
            _start_delay,
            _stop_delay,
            moves_leader=True,  # with short sessions it may: then the same checks apply
        ),
        Nemesis(
            "kill_leader",
            "SIGKILL of partition 0's leader, restarted at the heal",
            lambda net, c, t: c.kill(t.leader),
            _restart_leader,
            moves_leader=True,
        ),
    ]
}
