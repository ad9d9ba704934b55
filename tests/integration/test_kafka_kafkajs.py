"""kafkajs's idempotent producer across a leader SIGKILL (issue 25: the kafkajs finding;
docs/kafka.md "kafkajs"). Runs only where kafkajs is installed: set
``PIDLEASE_KAFKAJS_DIR`` to a folder holding ``node_modules/kafkajs`` (``npm install
kafkajs@2.2.4`` there); skipped otherwise (CI does not install npm packages).

The test copies kafkajs and adds log lines to ``sendMessages.js`` (every Produce request's
partition, sequence and values, every failure, and every partition a retry does not send
because its new leader answered an earlier attempt), then checks that every record kafkajs
reported as sent but that is not in the log belongs to a batch kafkajs never sent again
after its leader died, or to the batch after it, which reused that batch's sequence
numbers: the loss is the client's retry, not an answer of ours (which are Kafka's:
test_kafka_multi_partition_produce.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from pidlease.client.reader import Reader
from tests.integration.test_kafka_clients import verify

KAFKAJS_DIR = os.environ.get("PIDLEASE_KAFKAJS_DIR", "")
HERE = Path(__file__).parent / "kafkajs"

pytestmark = pytest.mark.skipif(
    not (KAFKAJS_DIR and (Path(KAFKAJS_DIR) / "node_modules" / "kafkajs").is_dir())
    or shutil.which("node") is None,
    reason="needs node and kafkajs (PIDLEASE_KAFKAJS_DIR)",
)

# (anchor in sendMessages.js, line added after it)
PROBES = [
    (
        "      const brokersWithoutResponse = brokers.filter(broker => !responsePerBroker.get(broker))\n",  # noqa: E501 - JavaScript, verbatim
        "      for (const broker of brokers.filter(b => responsePerBroker.get(b))) {\n"
        "        const answered = new Set(responsePerBroker.get(broker).map(r => `${r.topicName}/${r.partition}`))\n"  # noqa: E501 - JavaScript, verbatim
        "        for (const [topic, { partitionsPerLeader, messagesPerPartition }] of topicMetadata.entries())\n"  # noqa: E501 - JavaScript, verbatim
        "          for (const p of partitionsPerLeader[broker.nodeId] || [])\n"
        "            if (!answered.has(`${topic}/${p}`))\n"
        "              console.log(JSON.stringify({ skipped: messagesPerPartition[p].map(m => m.value), partition: Number(p), broker: broker.nodeId }))\n"  # noqa: E501 - JavaScript, verbatim
        "      }\n",
    ),
    (
        "          let response\n",
        "          for (const { partitions } of topicData) for (const e of partitions)\n"
        "            console.log(JSON.stringify({ req: broker.nodeId, partition: e.partition, seq: e.firstSequence, values: e.messages.map(m => m.value) }))\n",  # noqa: E501 - JavaScript, verbatim
    ),
]


def instrumented(tmp: Path) -> Path:
    dst = tmp / "kafkajs"
    shutil.copytree(Path(KAFKAJS_DIR) / "node_modules" / "kafkajs", dst)
    f = dst / "src" / "producer" / "sendMessages.js"
    src = f.read_text()
    for anchor, added in PROBES:
        assert src.count(anchor) == 1, f"kafkajs changed: {anchor!r}"
        src = src.replace(anchor, anchor + added)
    f.write_text(src)
    return dst


def test_kafkajs_loses_what_its_retry_skips(make_cluster: Any, tmp_path: Path) -> None:
    c = make_cluster(servers=2)
    c.create_topic("kj", partitions=2, replication_factor=2)
    env = dict(
        os.environ,
        NODE_PATH=str(Path(KAFKAJS_DIR) / "node_modules"),
        KAFKAJS=str(instrumented(tmp_path)),
    )
    p = subprocess.Popen(
        ["node", str(HERE / "failover.js"), c.kafka_bootstrap, "kj", "4000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    killer = threading.Timer(6.0, lambda: c.kill(c.servers[0]))  # partition 0's leader
    killer.start()
    out, _ = p.communicate(timeout=240)
    killer.join()
    lines = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
    acked = {ln["acked"] for ln in lines if "acked" in ln}
    read = {
        r.value.decode()
        for part in range(2)
        for r in Reader(c.coordinator_url, "kj", partition=part)
    }
    lost = acked - read
    skipped = [ln for ln in lines if "skipped" in ln]
    print(f"kafkajs: {len(acked)} acked, {len(read)} in the log, {len(lost)} lost: {sorted(lost)}")
    print(f"kafkajs: batches its retry skipped: {skipped}")
    assert "EXACTLY-ONCE: OK" in verify(c, "kj")  # the lost records left no trace
    if not lost:
        return  # the kill fell between two sends this time
    assert skipped, "records lost although no retry skipped a partition"
    # the lost records are the skipped batch, or the next batch of that partition, which
    # was sent with the skipped batch's sequence (a duplicate of it when it was written)
    reqs = [ln for ln in lines if "req" in ln]
    suspects: set[str] = set()
    for s in skipped:
        suspects |= set(s["skipped"])
        later = [
            r for r in reqs if r["partition"] == s["partition"] and r["values"] != s["skipped"]
        ]
        after = [r for r in later if int(r["values"][0][1:]) > int(s["skipped"][-1][1:])]
        if after:
            suspects |= set(after[0]["values"])
            reused = [r for r in reqs if r["values"] == s["skipped"]]
            assert reused and after[0]["seq"] == reused[-1]["seq"], (
                "the next batch reused its sequence"
            )
    assert lost <= suspects, (sorted(lost), sorted(suspects))
