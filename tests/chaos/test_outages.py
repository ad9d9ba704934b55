"""The two outages docs/reliability.md describes, observed on real processes:

- ZooKeeper lost entirely (every node stopped) for longer than the servers' session
  timeout while a producer is pipelining, then back;
- a full disk on a partition server, made with a file size limit (RLIMIT_FSIZE, inherited
  by the server process: a write past it fails with EFBIG as it would with ENOSPC, since
  Python ignores SIGXFSZ), then space freed by restarting the server without the limit.

Both end with the checker: every acknowledged record present once, in order. The figures
observed are printed (``OUTAGE ...`` lines) for the docs.
"""

from __future__ import annotations

import resource
import time
from concurrent.futures import Future
from pathlib import Path

import pytest
from checker import Acked, check, read_topic
from fulldisk import acked_count, failed_count, wait_stalled
from runner import PRODUCER_KW, SERVER_ENV, SESSION_TIMEOUT_MS

from pidlease import errors
from pidlease.client.producer import Producer
from pidlease.testing.devcluster import LocalCluster, http_json

WAIT_S = 120.0


def wait_resolved(futs: list[Future], timeout_s: float) -> tuple[list[Acked], int]:
    """(acked, failed) once every future resolved; fails the test past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    acked, failed = [], 0
    for f in futs:
        try:
            md = f.result(timeout=max(0.1, deadline - time.monotonic()))
        except errors.PidleaseError:
            failed += 1
            continue
        acked.append(md)
    return acked, failed


@pytest.mark.slow
def test_zookeeper_lost_then_back(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "c", servers=0, zk_nodes=1).start()
    try:
        cluster.add_server(1, extra_env=SERVER_ENV)
        cluster.create_topic("zkloss", partitions=2)
        futs: list[Future] = []
        with Producer(
            cluster.coordinator_url, "zkloss", producer_name="zk-loss", **PRODUCER_KW
        ) as p:  # type: ignore[arg-type]
            futs += [p.send(b"before-%d" % i) for i in range(2000)]
            p.flush()
            assert cluster.zk is not None
            cluster.zk.stop()
            time.sleep(SESSION_TIMEOUT_MS / 1000 * 2)  # past every session timeout
            during = [p.send(b"during-%d" % i) for i in range(2000)]
            futs += during
            time.sleep(5)
            acked_during = acked_count(during)
            t0 = time.monotonic()
            status, body = http_json(
                "POST",
                cluster.coordinator_url + "/v1/lease_pid",
                {"topic": "zkloss", "partition": 0, "pid": -1},
                timeout_s=60,
            )
            lease_s = time.monotonic() - t0
            h_status, _ = http_json("GET", cluster.coordinator_url + "/healthz", timeout_s=60)
            assert status == 503 and body["error"] == "COORDINATOR_UNAVAILABLE", (status, body)
            cluster.zk.restart(60)
            acked, failed = wait_resolved(futs, WAIT_S)
            pid = p.pid
        rep = check(
            read_topic(cluster.coordinator_url, "zkloss", 2),
            [Acked(m.partition, pid, m.sequence_id, m.offset) for m in acked],
        )
        print(
            f"OUTAGE zookeeper-lost: appends acked while ZooKeeper was down {acked_during}/2000; "
            f"new lease -> {status} {body['error']} in {lease_s:.1f}s; /healthz -> {h_status}; "
            f"after ZooKeeper came back: acked {len(acked)}, failed {failed}; {rep.summary()}"
        )
        assert failed == 0 and rep.ok, rep.summary()
    except BaseException:
        print(cluster.logs(60))
        raise
    finally:
        cluster.stop()


FSIZE_LIMIT_BYTES = 2 * 1024 * 1024


@pytest.mark.slow
def test_full_disk_then_space_freed(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = make_cluster(servers=0)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT_BYTES, hard))
    try:  # only the server started now inherits the limit
        svc = cluster.add_server(1, extra_env=SERVER_ENV)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    cluster.create_topic("full", partitions=1)
    value = b"v" * 200
    kw = {**PRODUCER_KW, "buffer_records_max": 25_000}  # so no send blocks on the full disk
    with Producer(cluster.coordinator_url, "full", producer_name="full-disk", **kw) as p:  # type: ignore[arg-type]
        futs = [p.send(value + b"%d" % i) for i in range(20_000)]  # ~4.2 MB: twice the limit
        wait_stalled(futs, stall_s=5, timeout_s=WAIT_S, interval_s=0.2)
        acked_when_full = acked_count(futs)
        failed_when_full = failed_count(futs)
        alive = svc.alive
        readable = (
            sum(1 for _ in read_topic(cluster.coordinator_url, "full", 1)[0]) if alive else -1
        )
        log = svc.log_path.read_text(errors="replace")
        disk_lines = [ln[24:200] for ln in log.splitlines() if " WARNING " in ln or " ERROR " in ln]
        retries_when_full = p.stats.get("retries", -1)
        cluster.kill(svc)
        cluster.start_service(svc)  # the operator freed space: no limit now
        acked, failed = wait_resolved(futs, WAIT_S)
        pid = p.pid
    rep = check(
        read_topic(cluster.coordinator_url, "full", 1),
        [Acked(m.partition, pid, m.sequence_id, m.offset) for m in acked],
    )
    print(
        f"OUTAGE full-disk: acked before the disk filled {acked_when_full}/20000, failed then "
        f"{failed_when_full}; server alive while full: {alive}; records readable while full: "
        f"{readable}; producer retries {retries_when_full}; "
        f"server warnings/errors: {disk_lines[:3]}; after space freed: acked "
        f"{len(acked)}, failed {failed}; {rep.summary()}"
    )
    assert acked_when_full < len(futs), "the size limit never filled the disk"
    assert failed == 0 and rep.ok, rep.summary()
