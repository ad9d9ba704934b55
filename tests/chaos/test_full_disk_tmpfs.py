"""A really full disk: a partition server's data dir is a tmpfs of 8 MiB (``mount -t
tmpfs``, needs root; skipped with the reason otherwise). A producer sends more than fits;
once the disk is full its appends are answered SERVER_UNAVAILABLE (retriable: the producer
retries, nothing fails), the server stays up, logs the failure and keeps serving reads.
Then the filesystem is grown (``mount -o remount,size=64m``) and the producer completes;
every acknowledged record is in the log exactly once, and still is after a SIGKILL and
restart of the server. ``test_outages.py`` has the same story with RLIMIT_FSIZE (EFBIG);
this one is ENOSPC itself."""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import pytest
from checker import Acked, check, read_topic
from fulldisk import acked_count, failed_count, mount, wait_stalled
from runner import SERVER_ENV

from pidlease.client.producer import Producer
from pidlease.testing.devcluster import LocalCluster

TOPIC = "tmpfs"
N_RECORDS = 50_000  # ~11 MiB of batches: more than the 8 MiB disk
VALUE = b"v" * 200
WAIT_S = 120.0


@pytest.mark.slow
def test_tmpfs_full_then_grown(tmpfs_cluster, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO, logger="pidlease.client.producer")
    cluster, data = tmpfs_cluster
    _run(cluster, data, caplog)


def _run(cluster: LocalCluster, data: Path, caplog: pytest.LogCaptureFixture) -> None:
    svc = cluster.add_server(1, extra_env=SERVER_ENV)
    cluster.create_topic(TOPIC, partitions=1)
    kw = {
        "max_in_flight": 5,
        "linger_ms": 5,
        "batch_records_max": 200,
        "request_timeout_ms": 5_000,
        "retry_backoff_max_ms": 500,
        "buffer_records_max": N_RECORDS + 1,
    }
    with Producer(cluster.coordinator_url, TOPIC, producer_name="tmpfs", **kw) as p:  # type: ignore[arg-type]
        futs = [p.send(VALUE + b"%d" % i) for i in range(N_RECORDS)]
        wait_stalled(futs, stall_s=5, timeout_s=WAIT_S, interval_s=0.2)
        acked_full = acked_count(futs)
        failed_full = failed_count(futs)
        df = shutil.disk_usage(data)
        alive_full = svc.alive
        readable_full = len(read_topic(cluster.coordinator_url, TOPIC, 1)[0])
        retries_full = p.stats.get("retries", 0)
        log = svc.log_path.read_text(errors="replace")
        disk_lines = [ln for ln in log.splitlines() if "append failed" in ln]
        assert acked_full < N_RECORDS, "the tmpfs never filled"
        assert failed_full == 0, "a full disk must be retried, not fail the sends"
        assert alive_full, "the server died on a full disk"
        assert retries_full > 0
        seen = [r.getMessage() for r in caplog.records if "retrying after" in r.getMessage()]
        assert any("SERVER_UNAVAILABLE" in m and "No space left" in m for m in seen), seen[:5]
        assert disk_lines and "No space left on device" in disk_lines[0], disk_lines
        assert "Traceback" not in log, log[-3000:]
        assert readable_full == acked_full  # every acked record readable; nothing half-written

        grown = mount("-o", "remount,size=64m", str(data))
        assert grown.returncode == 0, grown.stderr
        deadline = time.monotonic() + WAIT_S
        for f in futs:
            f.result(timeout=max(0.1, deadline - time.monotonic()))  # raises if any failed
        pid = p.pid
        metas = [f.result() for f in futs]
    acked = [Acked(m.partition, pid, m.sequence_id, m.offset) for m in metas]
    rep = check(read_topic(cluster.coordinator_url, TOPIC, 1), acked)
    assert rep.ok, rep.summary()
    cluster.kill(svc)  # SIGKILL: recovery from what the tmpfs holds
    cluster.start_service(svc)
    rep2 = check(read_topic(cluster.coordinator_url, TOPIC, 1), acked)
    print(
        f"OUTAGE tmpfs-full: acked before the disk filled {acked_full}/{N_RECORDS} "
        f"(disk {df.used}/{df.total} bytes used), failed {failed_full}, server alive "
        f"{alive_full}, readable while full {readable_full}, producer retries {retries_full}, "
        f"server log: {disk_lines[0][24:220]!r} ({len(disk_lines)} lines); after remount "
        f"size=64m: acked {len(metas)}, {rep.summary()}; after SIGKILL + restart: {rep2.summary()}"
    )
    assert rep2.ok, rep2.summary()
