"""kcat's idempotent producer (``kcat -P``, librdkafka 2.0) through a leader SIGKILL
(docs/kafka.md, "Clients x features", the failover column): lines fed to kcat's stdin
while the leader of the partition is SIGKILLed (and restarted); kcat exits 0 (every line
delivered), the partition holds every line exactly once and in order, and `pidlease
verify` finds no gap or duplicate."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from tests.helpers import wait_for
from tests.integration.test_kafka_clients import KCAT, kafka_consume, verify
from tests.integration.test_kafka_failover import ENV, TOPIC, leader_of, live_leader

N = 3_000


def test_kcat_idempotent_producer_through_a_leader_kill(make_cluster: Any, tmp_path: Path) -> None:
    c = make_cluster(servers=3, env=ENV)
    c.create_topic(TOPIC, partitions=1, replication_factor=3)
    live_leader(c, 0)
    lines = [f"kcat-{i:05d}" for i in range(N)]
    err_path = tmp_path / "kcat.err"
    err_file = err_path.open("w")
    proc = subprocess.Popen(
        [
            KCAT,
            "-P",
            "-b",
            c.kafka_bootstrap,
            "-t",
            TOPIC,
            "-p",
            "0",
            "-X",
            "enable.idempotence=true",
            "-X",
            "acks=all",
            "-X",
            "linger.ms=5",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=err_file,
        text=True,
    )
    assert proc.stdin is not None
    fed = [0]

    def feed() -> None:
        assert proc.stdin is not None
        for i, ln in enumerate(lines):
            proc.stdin.write(ln + "\n")
            if i % 50 == 49:
                proc.stdin.flush()
                time.sleep(0.05)  # about 1,000 lines a second
            fed[0] = i + 1
        proc.stdin.close()

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        wait_for(lambda: fed[0] >= N // 3, 60, "a third of the lines fed")
        leader = leader_of(c, 0)
        c.kill(c.server(leader))
        at_kill = fed[0]
        live_leader(c, 0, not_=leader)
        c.start_service(c.server(leader))
        feeder.join(120)
        proc.wait(300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        err_file.close()
    assert at_kill < N, "the leader died while lines were being fed"
    assert proc.returncode == 0, err_path.read_text()[-2000:]
    read = kafka_consume(c.kafka_bootstrap, TOPIC, 1, N)
    assert [v.decode() for _, v in read[0]] == lines, "every line once, in order"
    assert [o for o, _ in read[0]] == list(range(N))
    verify(c, TOPIC)
