"""The clients the consumer-group tests drive (test_kafka_groups.py,
test_kafka_groups_kills.py): an idempotent producer thread, group members as their own
processes (kafka_group_consumer.py: started, read and stopped here), the checks of the
members' logs, and ``kcat -P`` / ``kcat -G`` runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Producer

from pidlease.testing.devcluster import LocalCluster, http_json
from tests.helpers import wait_for

KCAT = "/usr/bin/kcat"
# The clusters' settings: a SIGKILLed server's session and a lagging follower end fast.
ENV = {
    "PIDLEASE_ZK_SESSION_TIMEOUT_MS": "4000",
    "PIDLEASE_REPLICA_LAG_TIME_MAX_MS": "3000",
    "PIDLEASE_HW_CHECKPOINT_INTERVAL_MS": "200",
}
ROOT = Path(__file__).resolve().parents[2]


def leader_of(c: LocalCluster, topic: str, partition: int) -> int:
    status, body = http_json("GET", f"{c.coordinator_url}/v1/topics/{topic}")
    assert status == 200, body
    return int(body["partition_states"][partition]["leader"])


class Sender(threading.Thread):
    """An idempotent confluent-kafka producer writing ``value-i`` to partition i mod n,
    ``rate`` records a second, until stopped; ``acked`` holds (partition, offset, value)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: float) -> None:
        super().__init__(daemon=True)
        self.p = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
            }
        )
        self.topic, self.n, self.rate = topic, partitions, rate
        self.acked: list[tuple[int, int, str]] = []
        self.errors: list[KafkaError] = []
        self.sent = 0
        self._halting = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        while not self._halting.is_set():
            due = int((time.monotonic() - t0) * self.rate)
            while self.sent < due:
                i = self.sent
                v = f"value-{i:07d}"
                self.p.produce(self.topic, v.encode(), partition=i % self.n, on_delivery=self._done)
                self.sent += 1
            self.p.poll(0.02)

    def _done(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.errors.append(err)
        else:
            self.acked.append((msg.partition(), msg.offset(), msg.value().decode()))

    def halt(self) -> None:
        self._halting.set()

    def stop(self) -> None:
        self._halting.set()
        self.join(30)
        assert self.p.flush(120) == 0, "undelivered records"
        assert not self.errors, self.errors[:3]


@dataclass
class Member:
    """One consumer process and its log (tests/integration/kafka_group_consumer.py)."""

    proc: subprocess.Popen[bytes]
    out: Path
    err: Any
    events: list[tuple[str, float, list[str]]] = field(default_factory=list)

    def read(self) -> list[tuple[str, float, list[str]]]:
        ev = []
        if not self.out.exists():
            return ev
        for line in self.out.read_text().splitlines():
            parts = line.split(" ")
            if len(parts) >= 2:
                try:
                    ev.append((parts[0], float(parts[1]), parts[2:]))
                except ValueError:
                    continue  # a line cut by SIGKILL
        self.events = ev
        return ev


def start_member(
    c: LocalCluster, group: str, topic: str, out: Path, client: str = "confluent"
) -> Member:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.kafka_group_consumer",
            c.kafka_bootstrap,
            group,
            topic,
            str(out),
            client,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(err := open(str(out) + ".err", "w")),  # noqa: SIM115 - closed in stop_members
    )
    return Member(proc, out, err)


def reads(members: list[Member]) -> set[tuple[int, int, str]]:
    return {(int(a[0]), int(a[1]), a[2]) for m in members for k, _, a in m.read() if k == "R"}


def wait_read(members: list[Member], acked: list[tuple[int, int, str]], timeout: float) -> None:
    want = set(acked)

    def done() -> bool:
        return want <= reads(members)

    wait_for(done, timeout, f"every one of {len(want)} acked records read", interval_s=0.5)


def check_group_log(members: list[Member], acked: list[tuple[int, int, str]]) -> dict[int, int]:
    """The members' logs against the producer's acknowledgements: every acked record read,
    no offset skipped, and a member starting a partition starts at or after every commit
    made before it started (no re-read of anything committed). Returns each partition's
    last commit."""
    read_at = reads(members)
    assert set(acked) <= read_at, "a record acked by the producer was never read"
    by_partition: dict[int, set[int]] = {}
    for p, o, _ in read_at:
        by_partition.setdefault(p, set()).add(o)
    for p, offs in by_partition.items():
        assert offs == set(range(max(offs) + 1)), f"partition {p}: an offset skipped"
    # Commits, with the time taken *before* the commit was sent (B lines): a commit
    # accepted before a member started a partition was sent before it started.
    commits: list[tuple[float, int, int]] = []
    for m in members:
        sent = {}
        for k, t, a in m.events:
            if k == "B":
                sent[int(a[0])] = t
            elif k == "C":
                p = int(a[0])
                commits.append((sent.get(p, t), p, int(a[1])))
    # Each member's first read of a partition after each assignment.
    for m in members:
        started: set[int] = set()
        for k, t, a in m.events:
            if k == "A":
                started = set()
            elif k == "R":
                p, o = int(a[0]), int(a[1])
                if p in started:
                    continue
                started.add(p)
                before = [off for tc, pc, off in commits if pc == p and tc < t]
                assert o >= max(before, default=0), (
                    f"partition {p} restarted at {o}, below a commit at {max(before)}"
                )
    last: dict[int, int] = {}
    for _, p, off in sorted(commits):
        last[p] = max(last.get(p, 0), off)
    return last


def first_reads(members: list[Member]) -> dict[int, int]:
    first: dict[int, tuple[float, int]] = {}
    for m in members:
        for k, t, a in m.read():
            if k == "R":
                p, o = int(a[0]), int(a[1])
                if p not in first or t < first[p][0]:
                    first[p] = (t, o)
    return {p: o for p, (_, o) in first.items()}


def stop_members(members: list[Member]) -> None:
    for m in members:
        if m.proc.poll() is None:
            m.proc.send_signal(signal.SIGTERM)
    for m in members:
        try:
            m.proc.wait(30)
        except subprocess.TimeoutExpired:
            m.proc.kill()
            m.proc.wait(10)
        m.err.close()


def kcat_produce(bootstrap: str, topic: str, lines: list[str], partitions: int = 2) -> None:
    """Line i to partition i mod ``partitions``: one ``kcat -P`` run a partition."""
    for p in range(partitions):
        r = subprocess.run(
            [KCAT, "-P", "-b", bootstrap, "-t", topic, "-p", str(p)],
            input="\n".join(x for i, x in enumerate(lines) if i % partitions == p) + "\n",
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert r.returncode == 0, r.stderr


def kcat_consume(bootstrap: str, group: str, topic: str, timeout_s: float = 90) -> list[str]:
    """One ``kcat -G`` run of ``group`` to the end of ``topic`` (from its commits, the
    earliest where none), committing what it read: the values read, sorted."""
    r = subprocess.run(
        [
            KCAT,
            "-b",
            bootstrap,
            "-G",
            group,
            "-e",  # (-o would override the committed offsets in -G mode)
            "-X",
            "auto.offset.reset=earliest",
            "-f",
            "%s\n",
            "-X",
            "session.timeout.ms=6000",
            topic,
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    return sorted(x for x in r.stdout.splitlines() if x)
