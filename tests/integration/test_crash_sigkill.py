"""SIGKILL the partition server in the middle of a pipelined produce of 100,000 records
(max_in_flight 5), restart it (optionally after tearing the newest segment's tail mid-batch,
as a crash during a write leaves it), and check with the audit and with `pidlease verify`
that every acknowledged record is in the log exactly once, in sequence order, at the
offset it was acknowledged with."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pidlease.cli.verify import verify_topic
from pidlease.client.producer import Producer
from pidlease.client.reader import Reader
from pidlease.wire import protocol as P
from tests.helpers import wait_for

RECORDS = 100_000
TOPIC = "crash"


def newest_segment(server_data: Path, topic: str, partition: int) -> Path:
    segs = sorted((server_data / f"{topic}-{partition}").glob("*.log"))
    assert segs, f"no segment files under {server_data / f'{topic}-{partition}'}"
    return segs[-1]


def tear_tail(seg: Path, pid: int, generation: int) -> int:
    """Append the first half of a plausible next batch: what a crash mid-write leaves."""
    batch = P.encode_batch(
        [(b"torn", b"x" * 200)] * 10,
        pid=pid,
        generation=generation,
        base_sequence=10**9,
        timestamp_ms=int(time.time() * 1000),
    )
    partial = batch[: len(batch) // 2]
    with open(seg, "ab") as f:
        f.write(partial)
    return len(partial)


def unanswered_batches(p: Producer) -> int:
    """Batches written to the server whose answer has not arrived (SDK internals)."""
    return sum(
        1
        for s in p._engine._senders
        for b in s.in_flight
        if b.response is not None and not b.response.done()
    )


@pytest.mark.slow
@pytest.mark.parametrize("torn", [False, True], ids=["sigkill", "sigkill-torn-tail"])
def test_sigkill_during_pipelined_produce(make_cluster, tmp_path: Path, torn: bool) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster(servers=1)
    cluster.create_topic(TOPIC, partitions=2, dedup="strict")
    svc = cluster.servers[0]
    server_data = cluster.data_dir / f"server-{svc.ident}" / "data"
    futures = []
    with Producer(
        cluster.coordinator_url,
        topic=TOPIC,
        producer_name="crash-test",
        max_in_flight=5,
        batch_records_max=500,
    ) as p:
        for i in range(RECORDS):
            futures.append(p.send(b"value-%d" % i, key=b"key-%d" % (i % 101)))
            if i == 40_000:
                wait_for(futures[10_000].done, interval_s=0.01)  # the pipeline is running
                # Freeze the server so the batches sent from now on are certainly in
                # flight, unanswered, when it dies (a fast producer may otherwise have had
                # every answer already, and a kill between batches tests no resend).
                cluster.signal_service(svc, signal.SIGSTOP)
            if i == 41_000:
                wait_for(lambda: unanswered_batches(p) > 0, interval_s=0.01)
                unresolved = sum(not f.done() for f in futures)
                cluster.kill(svc)  # SIGKILL, waited for
                if torn:
                    seg = newest_segment(server_data, TOPIC, 0)
                    size_before = seg.stat().st_size
                    torn_bytes = tear_tail(seg, p.pid, p.generation)
                    assert seg.stat().st_size == size_before + torn_bytes
                cluster.start_service(svc)
                print(f"killed with {unresolved} records unresolved")
        p.flush()
        stats = p.stats
        pid = p.pid
    metas = [f.result(timeout=0) for f in futures]  # every send acknowledged, none failed
    if torn:  # the restarted server found the torn tail and cut it off (and said so)
        assert f"truncated {torn_bytes} bytes" in svc.log_path.read_text(errors="replace")
    assert stats["retries"] > 0, "the producer should have seen the server die"

    acked = [(m.partition, pid, m.sequence_id) for m in metas]
    report = verify_topic(cluster.coordinator_url, TOPIC, acked=acked)
    print(report.summary())
    assert report.ok, report.summary()
    assert report.total("records") == RECORDS
    assert report.total("acked") == RECORDS and report.total("acked_missing") == 0

    # each acknowledged offset holds exactly the record that was acknowledged there
    for part in range(2):
        by_offset = {r.offset: r for r in Reader(cluster.coordinator_url, TOPIC, part)}
        seqs = [r.sequence_id for r in sorted(by_offset.values(), key=lambda r: r.offset)]
        assert seqs == list(range(len(seqs))), "sequence order in the log"
        for m in metas:
            if m.partition == part and m.offset >= 0:
                assert by_offset[m.offset].sequence_id == m.sequence_id
                assert by_offset[m.offset].pid == pid

    # and the command line agrees
    acked_file = tmp_path / "acked.jsonl"
    acked_file.write_text(
        "".join(
            json.dumps({"partition": a, "pid": b, "sequence_id": c}) + "\n" for a, b, c in acked
        )
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
        timeout=300,
        env={**os.environ},
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "EXACTLY-ONCE: OK" in out.stdout
    assert f"acked {RECORDS}, present {RECORDS}, missing 0" in out.stdout
