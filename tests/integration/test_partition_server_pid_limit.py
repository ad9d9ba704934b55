"""The tracked-PID limit against a real partition server: with room for two PIDs,
a third producer's first append is refused TOO_MANY_PIDS with a message saying what to do,
the two tracked producers go on, and once one of them has been idle for
pid_evict_idle_min_ms the newcomer gets in (the idle one is then UNKNOWN_PID, never a
duplicate). /metrics counts the refusal and the eviction; a restart (log replay) refuses
nothing."""

from __future__ import annotations

import time

import pytest

from partition_server.metrics import sample
from pidlease import errors
from pidlease.testing.devcluster import DEV_SECRET
from pidlease.testing.wire import WireClient, batch, create_topic, token
from tests.helpers import scrape_metrics

IDLE_MS = 1500
ENV = {
    "PIDLEASE_FSYNC_INTERVAL_MS": "1",
    "PIDLEASE_TRACKED_PIDS_MAX_PER_PARTITION": "2",
    "PIDLEASE_PID_EVICT_IDLE_MIN_MS": str(IDLE_MS),
}


@pytest.fixture
def server(make_cluster):  # type: ignore[no-untyped-def]
    cluster = make_cluster(servers=1, coordinators=0, env=ENV)
    return cluster, cluster.servers[0]


def test_limit_refuses_a_new_pid_until_one_is_idle_long_enough(server, zk_hosts) -> None:
    cluster, svc = server
    create_topic(zk_hosts, "lim")
    gen = 2
    tok = {pid: token(DEV_SECRET, pid, gen) for pid in (1, 2, 3)}
    nxt = {1: 0, 2: 0, 3: 0}

    def send(c: WireClient, pid: int) -> int:
        r = c.produce("lim", 0, batch(pid, gen, nxt[pid], [b"p%d-%d" % (pid, nxt[pid])]), tok[pid])
        if r.error_code == 0:
            nxt[pid] += 1
        return r.error_code

    with WireClient(svc.address) as c:
        assert send(c, 1) == 0 and send(c, 2) == 0
        started = time.monotonic()
        r = c.produce("lim", 0, batch(3, gen, 0, [b"p3-0"]), tok[3])
        assert r.error_code == errors.TooManyPids.code == 24
        assert errors.error_for_code(r.error_code).retriable
        for words in (
            "lim-0",
            "tracked_pids_max_per_partition=2",
            f"pid_evict_idle_min_ms={IDLE_MS}",
            "producer names",
            "PIDLEASE_TRACKED_PIDS_MAX_PER_PARTITION",
        ):
            assert words in r.detail, (words, r.detail)
        # the tracked producers carry on; PID 2 keeps busy, PID 1 goes idle
        assert send(c, 1) == 0 and send(c, 2) == 0
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < IDLE_MS / 1000 * 0.6:
            assert send(c, 2) == 0
            assert send(c, 3) == errors.TooManyPids.code
            time.sleep(0.1)
        deadline = time.monotonic() + 20
        while (code := send(c, 3)) == errors.TooManyPids.code:
            assert send(c, 2) == 0
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert code == 0
        assert time.monotonic() - started >= IDLE_MS / 1000  # not before the idle time
        # PID 1 was evicted: its next batch is UNKNOWN_PID, its retry is not a duplicate
        assert send(c, 1) == errors.UnknownPid.code
        r = c.produce("lim", 0, batch(1, gen, 1, [b"p1-1"]), tok[1])
        assert r.error_code == errors.UnknownPid.code
        assert send(c, 2) == 0 and send(c, 3) == 0
        recs = c.read_all("lim", 0)
    by_pid: dict[int, list[int]] = {}
    for rec in recs:
        by_pid.setdefault(rec.pid, []).append(rec.sequence_id)
    assert by_pid[1] == [0, 1] and by_pid[3] == list(range(nxt[3]))
    assert by_pid[2] == list(range(nxt[2]))

    got = scrape_metrics(svc.metrics_url)
    assert sample(got, "pidlease_server_pid_limit_refusals_total") >= 2
    assert sample(got, "pidlease_server_pids_evicted_total") == 1
    assert sample(got, "pidlease_server_tracked_pids") == 2

    # recovery replays the log (three PIDs in it) without refusing or losing anything
    cluster.kill(svc)
    cluster.start_service(svc)
    with WireClient(svc.address) as c:
        assert send(c, 2) == 0 and send(c, 3) == 0
        assert len(c.read_all("lim", 0)) == len(recs) + 2
