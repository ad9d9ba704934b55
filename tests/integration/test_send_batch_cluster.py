"""``send_batch`` on a real cluster (3 partition servers, replication factor 3, ZooKeeper,
coordinator, all real processes): a producer hands over whole batches (lists and Arrow
arrays, with a ``send()`` between calls), the leader is SIGKILLed in the middle, a new
leader takes over, the killed server comes back. Then the audit: every record of every
call acknowledged, each once in the log at the offset it was acknowledged with, in call
order, and ``pidlease verify`` exits 0."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from pidlease.cli.verify import verify_topic
from pidlease.client.producer import Producer
from pidlease.client.reader import Reader
from pidlease.client.structs import RecordMetadata
from pidlease.testing.devcluster import LocalCluster, http_json
from tests.helpers import wait_for

pa = pytest.importorskip("pyarrow")

TOPIC = "batches"
ENV = {
    "PIDLEASE_ZK_SESSION_TIMEOUT_MS": "4000",
    "PIDLEASE_REPLICA_LAG_TIME_MAX_MS": "3000",
    "PIDLEASE_HW_CHECKPOINT_INTERVAL_MS": "200",
}
CALLS = 120
PER_CALL = 500


def state(cluster: LocalCluster) -> dict[str, Any]:
    status, body = http_json("GET", f"{cluster.coordinator_url}/v1/topics/{TOPIC}")
    assert status == 200, body
    return body["partition_states"][0]


def live_leader(cluster: LocalCluster, not_: int | None = None) -> int:
    def ready() -> int | None:
        st = state(cluster)
        sid = st["leader"]
        if sid == not_ or not cluster.server(sid).alive or st["high_watermark"] < 0:
            return None
        return sid

    return wait_for(ready, 30, f"a live leader other than {not_}")


class BatchProducer(threading.Thread):
    """``CALLS`` send_batch calls of ``PER_CALL`` records into partition 0, about 20 calls a
    second (so the kill lands mid-run), every other one Arrow, a send() after each."""

    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__(name="batch-producer", daemon=True)
        self.cluster = cluster
        self.calls: list[tuple[list[bytes], Any]] = []  # (values, future)
        self.error: BaseException | None = None
        self.pid = -1
        self.stats: dict[str, int] = {}

    def run(self) -> None:
        try:
            with Producer(
                self.cluster.coordinator_url,
                topic=TOPIC,
                producer_name="batcher",
                max_in_flight=5,
                batch_records_max=200,
            ) as p:
                self.pid = p.pid
                t0 = time.monotonic()
                for c in range(CALLS):
                    values = [b"call-%d-rec-%d" % (c, i) for i in range(PER_CALL)]
                    arg = pa.array(values) if c % 2 else values
                    self.calls.append((values, p.send_batch(arg, partition=0)))
                    single = b"single-%d" % c
                    self.calls.append(([single], p.send(single, partition=0)))
                    time.sleep(max(0.0, t0 + (c + 1) / 20 - time.monotonic()))
                p.flush()
                self.stats = dict(p.stats)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def acked(self) -> int:
        return sum(len(v) for v, f in self.calls[:] if f.done())


@pytest.mark.slow
def test_leader_sigkilled_during_send_batch(make_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = make_cluster(servers=3, env=ENV)
    cluster.create_topic(TOPIC, partitions=1, replication_factor=3)
    leader = live_leader(cluster)
    prod = BatchProducer(cluster)
    prod.start()
    wait_for(lambda: prod.acked() >= 15_000, 90, "15,000 records acked before the kill")
    total = CALLS * (PER_CALL + 1)
    unresolved = total - prod.acked()
    cluster.kill(cluster.server(leader))  # SIGKILL, mid-run
    assert unresolved > 0 and prod.is_alive(), "the kill must be mid-run"
    new = live_leader(cluster, not_=leader)
    print(f"killed leader {leader} with {unresolved} records unresolved; new leader {new}")
    cluster.start_service(cluster.server(leader))
    prod.join(180)
    assert not prod.is_alive() and prod.error is None, prod.error
    assert prod.stats.get("retries", 0) > 0, "the producer saw the leader die"

    # every call acknowledged; its records in call order, sequences consecutive
    expected: list[tuple[bytes, int, int]] = []  # (value, offset, sequence)
    for values, fut in prod.calls:
        res = fut.result(timeout=0)
        metas = [res] if isinstance(res, RecordMetadata) else res
        assert len(metas) == len(values)
        expected += [(v, m.offset, m.sequence_id) for v, m in zip(values, metas, strict=True)]
    assert [s for _, _, s in expected] == list(range(total))

    acked = [(0, prod.pid, s) for _, _, s in expected]
    report = verify_topic(cluster.coordinator_url, TOPIC, acked=acked)
    print(report.summary())
    assert report.ok, report.summary()
    assert report.total("records") == total and report.total("acked_missing") == 0
    by_offset = {r.offset: r for r in Reader(cluster.coordinator_url, TOPIC, 0)}
    assert len(by_offset) == total
    for value, offset, seq in expected:
        if offset >= 0:
            r = by_offset[offset]
            assert (r.value, r.sequence_id, r.pid) == (value, seq, prod.pid)

    acked_file = tmp_path / "acked.jsonl"
    acked_file.write_text(
        "".join(f'{{"partition": 0, "pid": {b}, "sequence_id": {c}}}\n' for _, b, c in acked)
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pidlease.cli",
            "verify",
            TOPIC,
            "--acked",
            str(acked_file),
            "--coordinator",
            cluster.coordinator_url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"acked {total}, present {total}, missing 0" in out.stdout
