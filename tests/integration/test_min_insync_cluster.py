"""min_insync_replicas on real servers (issue 16 item 3): R=3 with the default minimum 2.
Both followers SIGKILLed: once the leader's in-sync set shrinks to itself a produce is
refused NOT_ENOUGH_REPLICAS with nothing written; a PATCH of the minimum applies without a
restart; an SDK producer retries through the outage and is acked once a follower is back;
everything acked is read back once."""

from __future__ import annotations

import time
from typing import Any

from pidlease import errors
from pidlease.client.producer import Producer
from pidlease.testing.devcluster import DEV_SECRET
from pidlease.testing.wire import WireClient, batch, token
from tests.helpers import wait_for

TOPIC = "m"
ENV = {
    "PIDLEASE_FSYNC_INTERVAL_MS": "1",
    "PIDLEASE_ZK_SESSION_TIMEOUT_MS": "4000",
    "PIDLEASE_REPLICA_LAG_TIME_MAX_MS": "1500",
    "PIDLEASE_HW_CHECKPOINT_INTERVAL_MS": "200",
}


def entry(address: str) -> dict[str, Any]:
    with WireClient(address) as c:
        md = c.metadata()
    return next(p for p in md["partitions"] if p["topic"] == TOPIC)


def test_r3_refuses_below_two_in_sync_and_acks_again_once_a_follower_is_back(
    make_cluster,
) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster(servers=3, coordinators=1, env=ENV)
    body = cluster.create_topic(TOPIC, 1, replication_factor=3)
    assert body["min_insync_replicas_effective"] == 2
    leader = cluster.server(1)  # partition 0 of a new topic: replicas [1, 2, 3], 1 leads
    tok = token(DEV_SECRET, 7, 1)
    acked: list[bytes] = []
    seq = 0

    def produce(c: WireClient) -> Any:
        nonlocal seq
        value = b"w-%d" % seq
        r = c.produce(TOPIC, 0, batch(7, 1, seq, [value]), tok)
        if r.error_code == 0:
            acked.append(value)
            seq += 1
        return r

    with WireClient(leader.address) as c:
        wait_for(
            lambda: produce(c).error_code == 0, 30, "the leader to take produces", interval_s=0.2
        )
        for _ in range(4):
            r = produce(c)
            assert r.error_code == 0, r.detail
        assert entry(leader.address)["min_insync"] == 2
        cluster.kill(cluster.server(2))
        cluster.kill(cluster.server(3))
        wait_for(
            lambda: entry(leader.address)["isr"] == [1],
            20,
            "the in-sync set to shrink to the leader",
            interval_s=0.2,
        )
        end = entry(leader.address)["log_end_offset"]
        r = produce(c)
        assert r.error_code == errors.NotEnoughReplicas.code, (r.error_code, r.detail)
        assert "min_insync_replicas" in r.detail
        after = entry(leader.address)
        assert after["log_end_offset"] == end  # nothing written
        assert after["high_watermark"] == end and after["min_insync_refusals"] >= 1

        # The minimum follows the topic's record, no restart: 1 takes the write, 2 again not.
        cluster.alter_topic(TOPIC, min_insync_replicas=1)
        wait_for(lambda: produce(c).error_code == 0, 10, "min in-sync 1 to apply", interval_s=0.1)
        cluster.alter_topic(TOPIC, min_insync_replicas=2)
        wait_for(
            lambda: produce(c).error_code == errors.NotEnoughReplicas.code,
            10,
            "min in-sync 2 to apply again",
            interval_s=0.1,
        )

    # An SDK producer during the outage: it retries, nothing is acked on one copy.
    with Producer(cluster.coordinator_url, topic=TOPIC, producer_name="sdk") as p:
        futs = [p.send(b"sdk-%d" % i, partition=0) for i in range(20)]
        wait_for(lambda: p.stats["retries"] > 0, 10, "the SDK to retry", interval_s=0.1)
        time.sleep(1)
        assert not any(f.done() for f in futs), "acked while only the leader was in sync"
        cluster.start_service(cluster.server(2))
        wait_for(
            lambda: entry(leader.address)["isr"] == [1, 2],
            30,
            "server 2 back in sync",
            interval_s=0.2,
        )
        metas = [f.result(30) for f in futs]
        assert [m.sequence_id for m in metas] == list(range(20))
        retries = p.stats["retries"]
    assert retries > 0

    with WireClient(leader.address) as c:
        r = produce(c)
        assert r.error_code == 0, r.detail
        values = [rec.value for rec in c.read_all(TOPIC, 0) if not rec.is_control]
    want = acked + [b"sdk-%d" % i for i in range(20)]
    assert sorted(values) == sorted(want)  # every acked record, each once
    assert len(values) == len(set(values))
