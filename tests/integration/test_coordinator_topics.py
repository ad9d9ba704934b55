"""Topics through the coordinator with real partition servers: creation with round-robin
replicas over the live servers, listing, description with offsets from the leaders'
METADATA, TOPIC_EXISTS, replication factor limited by live servers, and a 10,000-partition
topic (written in chunks under ZooKeeper's packet limit) that appears whole."""

from __future__ import annotations

import time
from typing import Any

from pidlease import errors
from pidlease.testing.devcluster import LocalCluster, http_json
from pidlease.testing.wire import WireClient
from pidlease.wire import protocol as P


def test_create_list_describe(make_cluster: Any) -> None:
    cluster: LocalCluster = make_cluster(servers=2)
    url = cluster.coordinator_url
    status, servers = http_json("GET", url + "/v1/servers")
    assert status == 200 and [s["id"] for s in servers["servers"]] == [1, 2]

    status, created = http_json(
        "POST",
        url + "/v1/topics",
        {"name": "orders", "partitions": 4, "replication_factor": 2, "dedup": "monotonic"},
    )
    assert status == 200, created
    states = created["partition_states"]
    assert [s["replicas"] for s in states] == [[1, 2], [2, 1], [1, 2], [2, 1]]
    assert [s["leader"] for s in states] == [1, 2, 1, 2]
    assert all(s["isr"] == s["replicas"] and s["leader_epoch"] == 0 for s in states)
    status, default = http_json("POST", url + "/v1/topics", {"name": "events", "partitions": 1})
    assert status == 200 and (default["replication_factor"], default["dedup"]) == (1, "strict")

    status, listing = http_json("GET", url + "/v1/topics")
    assert status == 200 and [t["name"] for t in listing["topics"]] == ["events", "orders"]

    status, body = http_json("POST", url + "/v1/topics", {"name": "orders", "partitions": 1})
    assert (status, body["error"]) == (409, "TOPIC_EXISTS")
    status, body = http_json(
        "POST", url + "/v1/topics", {"name": "x", "partitions": 1, "replication_factor": 3}
    )
    assert (status, body["error"]) == (400, "INVALID_REQUEST") and "2 are live" in body["detail"]

    # Offsets come from the leader: write 3 records to events/0 and describe.
    _, lease = http_json(
        "POST", url + "/v1/lease_pid", {"topic": "events", "partition": 0, "pid": -1}
    )
    leader = default["partition_states"][0]["leader_address"]
    w = WireClient(leader)
    try:
        batch = P.encode_batch(
            [(None, b"a"), (None, b"b"), (None, b"c")],
            pid=lease["pid"],
            generation=lease["generation"],
            base_sequence=0,
            timestamp_ms=int(time.time() * 1000),
        )
        assert w.produce("events", 0, batch, lease["lease_token"]).error_code == errors.NONE
    finally:
        w.sock.close()
    status, described = http_json("GET", url + "/v1/topics/events")
    assert status == 200
    row = described["partition_states"][0]
    assert set(row) == {
        "partition",
        "leader",
        "leader_address",
        "leader_epoch",
        "replicas",
        "isr",
        "log_start_offset",
        "log_end_offset",
        "high_watermark",
        "size_bytes",
        "segments_deleted",
        "bytes_deleted",
    }
    assert (row["segments_deleted"], row["bytes_deleted"]) == (0, 0)  # nothing retention took
    assert (row["log_start_offset"], row["log_end_offset"], row["high_watermark"]) == (0, 3, 3)
    # -1 from a server that does not report sizes yet; else the three records' bytes.
    assert row["size_bytes"] == -1 or row["size_bytes"] > 0
    assert row["leader_address"] == leader

    # The test cluster's conveniences pass log settings through.
    tuned = cluster.create_topic("tuned", retention_bytes=1 << 20, segment_bytes=1 << 16)
    assert (tuned["retention_bytes"], tuned["segment_bytes"]) == (1 << 20, 1 << 16)
    altered = cluster.alter_topic("tuned", segment_ms=-1)
    assert (altered["retention_bytes"], altered["segment_ms"]) == (1 << 20, -1)


def test_ten_thousand_partitions_appear_whole(make_cluster: Any) -> None:
    cluster: LocalCluster = make_cluster(servers=1)
    name = "big-" + "x" * 180  # long name: the chunking must count path bytes
    status, created = http_json(
        "POST",
        cluster.coordinator_url + "/v1/topics",
        {"name": name, "partitions": 10_000},
        timeout_s=120,
    )
    assert status == 200, created
    assert created["partitions"] == 10_000
    assert [s["partition"] for s in created["partition_states"]] == list(range(10_000))
    status, body = http_json(
        "POST",
        cluster.coordinator_url + "/v1/lease_pid",
        {"topic": name, "partition": 9_999, "pid": -1},
    )
    assert status == 200 and body["sequence_number"] == 0
    status, _ = http_json("GET", cluster.coordinator_url + "/healthz")
    assert status == 200, "the big creation did not cost the ZooKeeper session"
