"""kafkajs 2.2 beyond producing (issue 25: the kafkajs row of docs/kafka.md's matrix): its
group consumer against our group coordinator, its admin client, its compression. Runs only
where kafkajs is installed: set ``PIDLEASE_KAFKAJS_DIR`` to a folder holding
``node_modules/kafkajs`` (``npm install kafkajs@2.2.4`` there); skipped otherwise (CI does
not install npm packages). The scenarios are ``kafkajs/features.js``.

- groups: two kafkajs consumers in one group on a 4-partition topic share it (disjoint
  halves), read every record produced once, commit and leave; a consumer started again
  reads only what came after the commits; kafkajs's admin reads the same offsets;
- admin: createTopics with a config, describeConfigs, createPartitions, deleteTopics, and
  a config we do not take refused (INVALID_CONFIG);
- compression: gzip stored as sent (the batch on disk is gzip), read back by
  ``pidlease.Reader``, ``pidlease verify`` OK; snappy, lz4 and zstd are not in kafkajs
  (each needs a codec plugin package): it refuses to send, before any request;
- transactions: ``producer.transaction()`` fails "Failed to find group coordinator"
  (FindCoordinator for its transactional id is COORDINATOR_NOT_AVAILABLE: transactions are
  not supported) once its retries are spent; nothing written."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pidlease.client.producer import Producer
from pidlease.client.reader import Reader
from tests.helpers import wait_for
from tests.integration.test_kafka_clients import verify
from tests.integration.test_kafka_compression_clients import disk_codecs

KAFKAJS_DIR = os.environ.get("PIDLEASE_KAFKAJS_DIR", "")
SCRIPT = Path(__file__).parent / "kafkajs" / "features.js"

pytestmark = pytest.mark.skipif(
    not (KAFKAJS_DIR and (Path(KAFKAJS_DIR) / "node_modules" / "kafkajs").is_dir())
    or shutil.which("node") is None,
    reason="needs node and kafkajs (PIDLEASE_KAFKAJS_DIR)",
)


def env() -> dict[str, str]:
    return dict(os.environ, NODE_PATH=str(Path(KAFKAJS_DIR) / "node_modules"))


def run(*args: str, timeout_s: float = 120, retries: int = 10) -> list[dict[str, Any]]:
    r = subprocess.run(
        ["node", str(SCRIPT), *args],
        env=dict(env(), KAFKAJS_RETRIES=str(retries)),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert r.returncode in (0, 3), r.stdout + r.stderr
    return lines


class Member:
    """A kafkajs group consumer running in its own node process."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        self.p = subprocess.Popen(
            ["node", str(SCRIPT), bootstrap, "consume", topic, group],
            env=env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.lines: list[dict[str, Any]] = []
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            if line.startswith("{"):
                self.lines.append(json.loads(line))

    def assignment(self) -> list[int] | None:
        joins = [x["joined"] for x in self.lines if "joined" in x]
        return sorted(joins[-1]) if joins else None

    def read(self) -> list[tuple[int, int, str]]:
        return [(x["partition"], x["offset"], x["value"]) for x in self.lines if "value" in x]

    def leave(self) -> None:
        self.p.send_signal(signal.SIGTERM)
        self.p.wait(30)
        self._t.join(10)
        assert any("left" in x for x in self.lines), self.lines[-5:]

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)
        self._t.join(10)
        if self.p.stdout is not None:
            self.p.stdout.close()


def produce(c: Any, topic: str, values: list[bytes], partitions: int) -> None:
    with Producer(c.coordinator_url, topic=topic) as p:
        for i, v in enumerate(values):
            p.send(v, partition=i % partitions)
        p.flush()


def test_kafkajs_group_consumers_share_commit_and_resume(make_cluster: Any) -> None:
    c = make_cluster(servers=2)
    c.create_topic("kjg", partitions=4, replication_factor=2)
    members = [Member(c.kafka_bootstrap, "kjg", "kjgroup") for _ in range(2)]
    try:

        def shared() -> bool:
            got = [m.assignment() for m in members]
            return all(got) and sorted(p for g in got for p in g or []) == [0, 1, 2, 3]

        wait_for(shared, 90, "both kafkajs members assigned, the 4 partitions between them")
        first = [b"a%04d" % i for i in range(400)]
        produce(c, "kjg", first, 4)

        def all_read() -> bool:
            return sum(len(m.read()) for m in members) >= len(first)

        wait_for(all_read, 60, "every record read by the group")
        time.sleep(1)  # any extra read (a duplicate) would show now
        reads = [m.read() for m in members]
        assert sorted(v.encode() for r in reads for _, _, v in r) == sorted(first)
        for m, r in zip(members, reads, strict=True):
            assert {p for p, _, _ in r} <= set(m.assignment() or []), "read outside its share"
        for m in members:
            m.leave()
        got = run(c.kafka_bootstrap, "offsets", "kjg", "kjgroup")
        offsets = next(x["offsets"] for x in got if "offsets" in x)
        assert sorted(offsets) == [[p, 100] for p in range(4)]
        assert any("kjgroup" in x.get("groups", []) for x in got), got
        assert any(x.get("state") == "Empty" for x in got)

        second = [b"b%04d" % i for i in range(100)]
        produce(c, "kjg", second, 4)
        again = Member(c.kafka_bootstrap, "kjg", "kjgroup")
        members.append(again)
        wait_for(lambda: len(again.read()) >= len(second), 90, "the new records read")
        time.sleep(1)
        assert sorted(v.encode() for _, _, v in again.read()) == sorted(second), (
            "resumed at the commits: nothing of the first run read again"
        )
        assert min(o for _, o, _ in again.read()) == 100
        again.leave()
    finally:
        for m in members:
            m.kill()


def test_kafkajs_admin(make_cluster: Any) -> None:
    c = make_cluster(servers=1)
    got = run(c.kafka_bootstrap, "admin", "kja")
    assert {"created": True} in got, got
    assert {"partitions": 2} in got
    assert {"retention": ["3600000"]} in got
    assert {"partitions_after": 4} in got
    assert {"bad_config": "INVALID_CONFIG"} in got
    assert {"deleted": True} in got
    assert not [x for x in got if "error" in x], got


def test_kafkajs_gzip_stored_as_sent_and_the_other_codecs_need_plugins(
    make_cluster: Any,
) -> None:
    c = make_cluster(servers=1)
    c.create_topic("kjz", partitions=1, replication_factor=1)
    got = run(c.kafka_bootstrap, "compress", "kjz", "gzip", "400")
    assert {"sent": 400} in got, got
    values = [r.value for r in Reader(c.coordinator_url, "kjz", partition=0)]
    assert values == [
        b'{"client": "kafkajs", "n": %06d, "pad": "%s"}' % (i, b"ab" * 40) for i in range(400)
    ]
    assert "400" in verify(c, "kjz")
    assert set(disk_codecs(c, "kjz")) == {"gzip"}
    for codec in ("snappy", "lz4", "zstd"):
        c.create_topic(f"kj{codec}", partitions=1, replication_factor=1)
        got = run(c.kafka_bootstrap, "compress", f"kj{codec}", codec, "100")
        errors = [x["error"] for x in got if "error" in x]
        assert errors and "compression not implemented" in errors[0].lower(), got
        assert list(Reader(c.coordinator_url, f"kj{codec}", partition=0)) == []


def test_kafkajs_transaction_refused(make_cluster: Any) -> None:
    c = make_cluster(servers=1)
    c.create_topic("kjt", partitions=1, replication_factor=1)
    got = run(c.kafka_bootstrap, "transaction", "kjt", timeout_s=300, retries=2)
    assert not any("committed" in x for x in got), got
    errors = [x for x in got if "error" in x]
    # FindCoordinator for a transactional id: COORDINATOR_NOT_AVAILABLE, retried, then:
    assert [e["type"] for e in errors] == ["KafkaJSGroupCoordinatorNotFound"], got
    assert errors[0]["error"] == "Failed to find group coordinator"
    assert list(Reader(c.coordinator_url, "kjt", partition=0)) == [], "nothing written"
