"""The size bound of retention at R=3, on disk (issue 13 "Must show", CI-sized; the full
1 GiB run is ``bench/bench_log.py --part disk``): a topic with ``retention_bytes`` 1 MiB
and 128 KiB segments, 16 MiB produced through its leader. A thread measures each replica's
partition directory every 20 ms; the segment files never add up to more than
``retention_bytes`` plus two segments on any replica, every replica's log start moved, and
every record from the log start on reads back in order (``Reader(start="earliest")``).

Only the ``*.log`` segment files count towards the bound: the directory also holds small
bookkeeping files (``log-start``, and index files once segments have them) whose size is
not what ``retention_bytes`` limits.

Retention runs when a segment rolls and again when the snapshot a deletion waits for is
written (``LogManager.retention_soon``), so the bound holds with the default
``retention_check_ms`` (30 s, longer than this test) at whatever rate the producer
reaches: nothing is paced.
"""

from __future__ import annotations

import contextlib
import struct
import threading
import time
from pathlib import Path
from typing import Any

from pidlease.client.reader import Reader
from pidlease.testing.devcluster import DEV_SECRET, LocalCluster, Service
from pidlease.testing.wire import WireClient, batch, token
from tests.helpers import wait_for

KiB = 1024
RETENTION = 1024 * KiB
SEGMENT = 128 * KiB
BOUND = RETENTION + 2 * SEGMENT
PRODUCED = 16 * 1024 * KiB
VALUE = 4 * KiB
PER_BATCH = 4  # 16 KiB batches: 8 to a segment
RATE = 0  # bytes of values a second; 0: as fast as the cluster takes them
ENV = {"PIDLEASE_FSYNC_INTERVAL_MS": "1"}  # retention_check_ms stays 30 s
SEQ = struct.Struct(">Q")


def segment_bytes(directory: Path) -> int:
    total = 0
    for p in directory.glob("*.log"):
        # retention may unlink it between the listing and the stat
        with contextlib.suppress(FileNotFoundError):
            total += p.stat().st_size
    return total


class MaxSize:
    """The largest ``segment_bytes`` of each directory, sampled on a thread."""

    def __init__(self, dirs: list[Path], interval_s: float = 0.02) -> None:
        self.dirs = dirs
        self.max = [0] * len(dirs)
        self.samples = 0
        self._stop = threading.Event()
        self._interval_s = interval_s
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for i, d in enumerate(self.dirs):
                self.max[i] = max(self.max[i], segment_bytes(d))
            self.samples += 1
            self._stop.wait(self._interval_s)

    def __enter__(self) -> MaxSize:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def entry(svc: Service, topic: str) -> dict[str, Any] | None:
    with WireClient(svc.address) as c:
        md = c.metadata()
    return next((p for p in md["partitions"] if p["topic"] == topic), None)


def test_r3_disk_use_stays_under_retention_bytes_plus_two_segments(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = make_cluster(servers=3, coordinators=1, env=ENV)
    topic = "bounded"
    cluster.create_topic(
        topic, 1, 3, retention_bytes=RETENTION, segment_bytes=SEGMENT, retention_ms=-1
    )

    def leader() -> Service | None:
        for svc in cluster.servers:
            e = entry(svc, topic)
            if e is not None and e["role"] == "leader":
                return svc
        return None

    lead = wait_for(leader, 30, "a leader", interval_s=0.1, ignore=(OSError,))
    pid = 4242
    tok = token(DEV_SECRET, pid, 1)
    dirs = [cluster.data_dir / f"server-{s.ident}" / "data" / f"{topic}-0" for s in cluster.servers]
    batches = PRODUCED // (VALUE * PER_BATCH)
    pad = b"v" * (VALUE - SEQ.size)
    with WireClient(lead.address) as c, MaxSize(dirs) as sizes:
        t0 = time.monotonic()
        for i in range(batches):
            seq = i * PER_BATCH
            b = batch(pid, 1, seq, [SEQ.pack(seq + j) + pad for j in range(PER_BATCH)])
            r = wait_for(
                lambda b=b: (r := c.produce(topic, 0, b, tok)).error_code == 0 and r,  # type: ignore[misc]
                30,
                "a produce to be taken",
                interval_s=0.1,
            )
            if RATE:
                ahead = t0 + (i + 1) * VALUE * PER_BATCH / RATE - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)

        def caught_up() -> bool:
            es = [entry(s, topic) for s in cluster.servers]
            return all(e is not None and e["log_end_offset"] > r.last_offset for e in es)

        wait_for(caught_up, 30, "every replica to catch up")
        time.sleep(0.2)  # a few more samples: a follower's last deletion comes after its append
    assert sizes.samples > 100
    for d, most in zip(dirs, sizes.max, strict=True):
        assert most <= BOUND, f"{d.parent.parent.name}: {most} bytes of segments > {BOUND}"

    def starts() -> list[int] | None:
        got = [(entry(s, topic) or {}).get("log_start_offset", 0) for s in cluster.servers]
        return got if all(got) else None

    wait_for(starts, 10, "every replica's log start to move")

    e = entry(lead, topic)
    assert e is not None
    start, hw = e["log_start_offset"], e["high_watermark"]
    offsets, seqs = [], []
    with Reader(cluster.coordinator_url, topic, 0, start="earliest") as reader:
        for rec in reader:
            offsets.append(rec.offset)
            seqs.append(SEQ.unpack_from(rec.value)[0])
    assert offsets == list(range(start, hw))
    # One producer and no control batch: each record's sequence number is its offset.
    assert seqs == offsets and seqs[-1] == batches * PER_BATCH - 1
