"""Crash recovery with real SIGKILLs: torn tails truncated and reported, every acked batch
present, snapshots used, kills under pipelined load, PID expiry, and settings refusal."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from partition_server.testing import active_segment, tear_tail
from pidlease import errors
from pidlease.testing.devcluster import DEV_SECRET
from pidlease.testing.wire import WireClient, batch, create_topic, token
from pidlease.wire import protocol as P

ENV = {"PIDLEASE_FSYNC_INTERVAL_MS": "1"}


def data_dir(cluster) -> Path:  # type: ignore[no-untyped-def]
    return cluster.data_dir / "server-1" / "data"


@pytest.mark.parametrize("cut", [20, "half"])
def test_torn_tail_after_sigkill_is_truncated_and_reported(make_cluster, zk_hosts, cut) -> None:
    cluster = make_cluster(servers=1, coordinators=0, env=ENV)
    svc = cluster.servers[0]
    create_topic(zk_hosts, "torn")
    pid, gen = 21, 2
    tok = token(DEV_SECRET, pid, gen)
    acked = []
    with WireClient(svc.address) as c:
        for i in range(20):
            c.produce_send(
                "torn", 0, batch(pid, gen, i * 4, [b"r%d-%d" % (i, j) for j in range(4)]), tok
            )
        for _ in range(20):
            r = c.recv()
            assert r.error_code == 0
            acked.append((r.base_offset, r.last_offset))
    cluster.kill(svc)
    good_size = active_segment(data_dir(cluster), "torn", 0).stat().st_size
    nxt = bytearray(batch(pid, gen, 80, [b"never-acked"] * 3))
    P.set_base_offset(nxt, 80)
    partial = bytes(nxt[: cut if isinstance(cut, int) else len(nxt) // 2])
    seg = tear_tail(data_dir(cluster), "torn", 0, partial)
    cluster.start_service(svc)
    text = svc.log_path.read_text()
    assert f"truncated {len(partial)} bytes at offset 80 of segment {seg.name}" in text
    assert seg.stat().st_size == good_size
    with WireClient(svc.address) as c:
        recs = list(c.read_all("torn", 0))
        assert [r.value for r in recs] == [b"r%d-%d" % (i, j) for i in range(20) for j in range(4)]
        assert [r.offset for r in recs] == list(range(80))
        # the producer's state came back too: a retry of an acked batch is DUPLICATE with its
        # offsets, and the torn batch can be sent again at its sequence
        d = c.produce("torn", 0, batch(pid, gen, 76, [b"r19-%d" % j for j in range(4)]), tok)
        assert (d.error_code, d.base_offset, d.last_offset) == ((errors.DUPLICATE,) + acked[-1])
        r = c.produce("torn", 0, batch(pid, gen, 80, [b"again"]), tok)
        assert (r.error_code, r.base_offset) == (0, 80)


def test_recovery_uses_the_snapshot_and_replays_only_the_rest(make_cluster, zk_hosts) -> None:
    env = dict(ENV, PIDLEASE_SNAPSHOT_INTERVAL_BATCHES="10")
    cluster = make_cluster(servers=1, coordinators=0, env=env)
    svc = cluster.servers[0]
    create_topic(zk_hosts, "snap", 2)
    with WireClient(svc.address) as c:
        for i in range(25):
            tok = token(DEV_SECRET, 100 + i % 5, 1)
            seq = i // 5
            r = c.produce("snap", i % 5 % 2, batch(100 + i % 5, 1, seq, [b"x"]), tok)
            assert r.error_code == 0, r.detail
    snaps_dir = data_dir(cluster) / "snapshots"
    deadline = time.monotonic() + 30
    while len(list(snaps_dir.glob("*.snap"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(list(snaps_dir.glob("*.snap"))) == 2  # 2 taken and kept
    cluster.kill(svc)
    cluster.start_service(svc)
    with WireClient(svc.address) as c:
        rec = c.metadata()["recovery"]
        assert rec["snapshot"] is not None
        assert rec["batches"] == 25 and 0 <= rec["batches_replayed"] < 25
        for i in range(25, 30):  # the state is right: next sequences are accepted
            tok = token(DEV_SECRET, 100 + i % 5, 1)
            r = c.produce("snap", i % 5 % 2, batch(100 + i % 5, 1, i // 5, [b"y"]), tok)
            assert r.error_code == 0, r.detail
        r = c.produce("snap", 0, batch(100, 1, 2, [b"x"]), token(DEV_SECRET, 100, 1))
        assert r.error_code == errors.DUPLICATE
    assert re.search(r"recovery: snapshot \d+\.snap", svc.log_path.read_text())


def test_a_damaged_newest_snapshot_falls_back_and_still_recovers(make_cluster, zk_hosts) -> None:
    env = dict(ENV, PIDLEASE_SNAPSHOT_INTERVAL_BATCHES="3")
    cluster = make_cluster(servers=1, coordinators=0, env=env)
    svc = cluster.servers[0]
    create_topic(zk_hosts, "snap2")
    tok = token(DEV_SECRET, 9, 0)
    with WireClient(svc.address) as c:
        for i in range(10):
            assert c.produce("snap2", 0, batch(9, 0, i, [b"x"]), tok).error_code == 0
    cluster.stop_service(svc)  # clean stop: takes a final snapshot
    snaps = sorted((data_dir(cluster) / "snapshots").glob("*.snap"))
    raw = bytearray(snaps[-1].read_bytes())
    raw[-1] ^= 0xFF
    snaps[-1].write_bytes(bytes(raw))
    cluster.start_service(svc)
    with WireClient(svc.address) as c:
        st = c.producer_state("snap2", 0, 9)
        assert (st.found, st.durable_highwater) == (True, 9)
        assert c.produce("snap2", 0, batch(9, 0, 10, [b"x"]), tok).error_code == 0
    assert f"snapshot {snaps[-1].name} is unusable" in svc.log_path.read_text()


def test_every_acked_batch_survives_sigkill_under_pipelined_load(make_cluster, zk_hosts) -> None:
    cluster = make_cluster(servers=1, coordinators=0, env=ENV)
    svc = cluster.servers[0]
    create_topic(zk_hosts, "load")
    acked: list[tuple[int, int, int]] = []  # (offset, pid, sequence)
    stop = threading.Event()

    def producer(pid: int) -> None:
        tok = token(DEV_SECRET, pid, 0)
        try:
            with WireClient(svc.address, timeout_s=10) as c:
                seq = 0
                for _ in range(100_000):
                    if stop.is_set():
                        return
                    for k in range(8):
                        c.produce_send("load", 0, batch(pid, 0, seq + k, [b"p%d" % pid]), tok)
                    for k in range(8):
                        r = c.recv()
                        if r.error_code != 0:
                            return
                        acked.append((r.base_offset, pid, seq + k))
                    seq += 8
        except (ConnectionError, OSError):
            return

    threads = [threading.Thread(target=producer, args=(p,)) for p in (1, 2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while len(acked) < 400 and time.monotonic() < deadline:
        time.sleep(0.01)
    cluster.kill(svc)
    stop.set()
    for t in threads:
        t.join(30)
    assert len(acked) >= 400
    cluster.start_service(svc)
    with WireClient(svc.address) as c:
        stored = {(r.offset, r.pid, r.sequence_id) for r in c.read_all("load", 0)}
        assert set(acked) <= stored
        for pid in (1, 2):  # per producer: in order, no duplicates, no gaps
            seqs = [s for _, p, s in sorted(stored) if p == pid]
            assert seqs == list(range(len(seqs)))


def test_pid_state_expires_after_disuse(make_cluster, zk_hosts) -> None:
    env = dict(
        ENV,
        PIDLEASE_PID_EXPIRE_MS="300",
        PIDLEASE_ALLOW_SHORT_PID_EXPIRE="1",
        PIDLEASE_PID_EXPIRE_CHECK_MS="50",
    )
    cluster = make_cluster(servers=1, coordinators=0, env=env)
    svc = cluster.servers[0]
    create_topic(zk_hosts, "exp")
    tok = token(DEV_SECRET, 4, 0)
    with WireClient(svc.address) as c:
        assert c.produce("exp", 0, batch(4, 0, 0, [b"x"]), tok).error_code == 0
        deadline = time.monotonic() + 30
        while c.metadata()["tracked_pids_total"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.metadata()["tracked_pids_total"] == 0
        assert not c.producer_state("exp", 0, 4).found
        assert c.produce("exp", 0, batch(4, 0, 1, [b"x"]), tok).error_code == errors.UnknownPid.code
    assert "expired 1 pids" in svc.log_path.read_text()


def test_refuses_a_pid_expiry_below_the_lease_maximum(tmp_path: Path) -> None:
    env = dict(
        os.environ,
        PIDLEASE_PID_EXPIRE_MS="1000",
        PIDLEASE_DATA_DIR=str(tmp_path),
        PIDLEASE_ZK="127.0.0.1:1/none",
    )
    env.pop("PIDLEASE_ALLOW_SHORT_PID_EXPIRE", None)
    p = subprocess.run(
        [sys.executable, "-m", "partition_server"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert p.returncode == 2
    assert "PIDLEASE_ALLOW_SHORT_PID_EXPIRE" in p.stderr


def test_restart_replaces_its_stale_znode_and_keeps_the_port(make_cluster, zk_hosts) -> None:
    cluster = make_cluster(servers=1, coordinators=0, env=ENV)
    svc = cluster.servers[0]
    create_topic(zk_hosts, "z")
    for _ in range(2):
        cluster.kill(svc)  # the old session's ephemeral znode is still there
        cluster.start_service(svc)
    assert "replacing stale /servers/1" in svc.log_path.read_text()
    with WireClient(svc.address) as c:
        assert c.produce("z", 0, batch(0, 0, 0, [b"x"])).error_code == 0
    assert active_segment(data_dir(cluster), "z", 0).stat().st_size > 0
