"""The nemesis suite on network-namespace hosts, short form (CI): one cluster (ZooKeeper,
three partition servers, the coordinator and the producers each on a host of its own),
then one nemesis per test on it, in file order, each followed by the exactly-once check
of the whole log; at the end the replicas must be byte-identical. The long form, every
nemesis with the servers' defaults: ``python -m tests.chaos.netns --all``.

Skipped, with the reason, where namespaces cannot be made (not root, no ``ip``/``nft``).
"""

from __future__ import annotations

import errno
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from netns_nemeses import NEMESES
from netns_suite import (
    IDLE_PARTITIONS,
    PARTITIONS,
    AckAt,
    PhaseResult,
    Suite,
    longest_gap,
    netns_cluster,
    table,
)

from pidlease.testing.netns import NETNS_DIR, PREFIX, Network, remove_stale, unavailable

# The servers' defaults, but a follower leaves the in-sync set after 4 s, not 10 s, so the
# split's NOT_ENOUGH_REPLICAS comes within the hold.
SHORT_ENV = {"PIDLEASE_REPLICA_LAG_TIME_MAX_MS": "4000"}
HOLD_S = 10.0
# Issue 16 asks for 2 s; the loaded CI machine gets some slack.
ACKED_AGAIN_MAX_S = 5.0
WHY_NOT = unavailable() if sys.platform == "linux" else "network namespaces are Linux's"
needs_netns = pytest.mark.skipif(WHY_NOT is not None, reason=f"no namespaces: {WHY_NOT}")


# -- the measuring functions, on made-up acks (no root needed) -----------------------------
def ack(t: float, partition: int = 0, offset: int = 0, *, dup: bool = False) -> AckAt:
    return AckAt(0, t, partition, 1, 0, offset, dup)


def test_longest_gap_counts_from_the_nemesis_to_the_end() -> None:
    assert longest_gap([], 10.0, 15.0) == 5.0
    assert longest_gap([11.0, 14.5], 10.0, 15.0) == 3.5
    assert longest_gap([9.0, 10.5, 16.0], 10.0, 15.0) == 4.5  # outside [start, end] ignored


def test_fewer_copies_counts_acks_beyond_the_second_longest_replica() -> None:
    leos = {0: [120, 100, 80], 1: [50]}
    acks = [ack(0, 0, 99), ack(0, 0, 100), ack(0, 0, 119), ack(0, 1, 10), ack(0, 1, -1)]
    # offset 99 is on two replicas; 100 and 119 on one; partition 1 has one live replica.
    assert Suite.fewer_copies(acks, leos) == 3


# -- the namespaces themselves -------------------------------------------------------------
@needs_netns
def test_network_cuts_one_way_and_heals_and_leaves_nothing() -> None:
    net = Network(["a", "client"]).start()
    try:
        addr = net.hosts["a"].address
        with net.entered("a"):
            srv = socket.create_server((addr, 9000))

        def serve() -> None:
            for _ in range(6):  # bounded: one per connect below that gets through
                try:
                    conn, _ = srv.accept()
                except OSError:
                    return
                conn.close()

        threading.Thread(target=serve, daemon=True).start()

        def reaches(tries: int = 1) -> bool:
            # A healed link may need a few seconds: the neighbour entry failed meanwhile.
            for _ in range(tries):
                try:
                    with socket.create_connection((addr, 9000), timeout=1.0):
                        return True
                except OSError:
                    continue
            return False

        with net.entered("client"):
            assert reaches(tries=10)
            net.cut("client", "a", one_way=True)
            assert not reaches()
            net.heal()
            assert reaches(tries=10)
            net.link("a", up=False)
            assert not reaches()
            net.heal()
            assert reaches(tries=10)
            # No default route: nothing in a host can leave the namespaces.
            with pytest.raises(OSError, match="unreachable") as got:
                socket.create_connection(("203.0.113.1", 80), timeout=1.0)
            assert got.value.errno == errno.ENETUNREACH
        srv.close()
    finally:
        net.close()
    assert net.leftovers() == []
    assert not [e for e in NETNS_DIR.iterdir() if e.name.startswith(net.bridge_ns[:-3])]


# -- the suite -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def suite(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Suite]:
    if WHY_NOT is not None:
        pytest.skip(f"no namespaces: {WHY_NOT}")
    base = tmp_path_factory.mktemp("netns")
    failed_before = request.session.testsfailed
    with netns_cluster(base, SHORT_ENV) as (net, cluster):
        s = Suite(net, cluster, HOLD_S)
        s.setup()
        try:
            yield s
        finally:
            s.teardown()
            print(table(s.results, "pytest tests/chaos/test_netns.py"))
            if request.session.testsfailed > failed_before:
                print(cluster.logs(60))


def exactly_once(res: PhaseResult) -> None:
    assert res.report is not None
    assert res.report.ok, res.summary()
    assert res.acked > 0, "producers made no progress"
    assert res.lost == 0 and res.duplicated == 0, res.summary()


@pytest.mark.slow
def test_isolated_leader_is_replaced_and_acks_resume(suite: Suite) -> None:
    res = suite.run(NEMESES["isolate_leader"])
    exactly_once(res)
    assert res.elected_after_s is not None, res.summary()
    assert res.acked_again_after_election_s is not None, res.summary()
    assert res.old_leader_acks_after_election == 0, res.summary()
    if res.stepdown_after_s is not None:  # it may not get to log it before the heal
        assert res.old_leader_acks_after_stepdown == 0, res.summary()
    if res.acked_again_after_election_s > ACKED_AGAIN_MAX_S:
        # Known (issue 16 item 5): a producer whose requests went to a leader that now
        # answers nothing waits for its request timeout (30 s) or the heal before it looks
        # the leader up again. Safety is asserted above; this is availability.
        pytest.xfail(
            f"acked again {res.acked_again_after_election_s} s after the election "
            f"(> {ACKED_AGAIN_MAX_S} s): the SDK waits for an unreachable old leader"
        )


@pytest.mark.slow
def test_leader_cut_from_zookeeper_steps_down_before_the_new_leader_acks(suite: Suite) -> None:
    """The zombie leader of issue 16: it still reaches clients and followers, but not
    ZooKeeper. It must stop acknowledging (step down) before a new leader is elected, and
    producers must be acked again soon after the election."""
    res = suite.run(NEMESES["leader_zk_cut"])
    exactly_once(res)
    assert res.elected_after_s is not None, res.summary()
    assert res.old_leader_acks_after_election == 0, res.summary()
    assert res.stepdown_after_s is not None, f"the old leader never stepped down\n{res.summary()}"
    assert res.stepdown_after_s < res.elected_after_s, res.summary()
    assert res.old_leader_acks_after_stepdown == 0, res.summary()
    assert res.acked_again_after_election_s is not None, res.summary()
    assert res.acked_again_after_election_s <= ACKED_AGAIN_MAX_S, res.summary()


@pytest.mark.slow
def test_split_leader_and_zookeeper_from_followers_refuses_single_copy_acks(
    suite: Suite,
) -> None:
    res = suite.run(NEMESES["split_leader_zk"])
    exactly_once(res)
    assert res.fewer_copies_acks == 0, res.summary()
    assert res.retries.get("NOT_ENOUGH_REPLICAS", 0) > 0, res.summary()


@pytest.mark.slow
def test_isolated_follower_does_not_flap_in_and_out_of_the_isr(suite: Suite) -> None:
    res = suite.run(NEMESES["isolate_follower"])
    exactly_once(res)
    assert res.isr_writes is not None and res.isr_writes_idle is not None, res.summary()
    # One shrink per partition it follows (all of them at R=3); a flapping follower made
    # ~1.8 writes per partition per second (issue 16: 139 in 11 s on 7 partitions).
    assert res.isr_writes <= PARTITIONS, res.summary()
    assert res.isr_writes_idle <= IDLE_PARTITIONS, res.summary()


@pytest.mark.slow
def test_replicas_byte_identical_after_the_nemeses(suite: Suite) -> None:
    assert suite.results, "no nemesis ran"
    assert suite.identical_replicas() == []


@needs_netns
def test_namespaces_of_a_dead_run_are_removed_by_the_next() -> None:
    # A run killed with SIGKILL cannot clean up: its namespaces carry its PID, gone now.
    gone_pid = _a_dead_pid()
    name = f"{PREFIX}{gone_pid}-zk"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert name in remove_stale()
        assert not (NETNS_DIR / name).exists()
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


def _a_dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_unavailable_names_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    from pidlease.testing import netns

    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    assert unavailable() == "network namespaces need root"
    monkeypatch.setattr(netns.os, "geteuid", lambda: 0)
    monkeypatch.setattr(netns.shutil, "which", lambda tool: None if tool == "ip" else "/x")
    assert unavailable() == "no `ip` command (Debian: iproute2, nftables)"
