"""Takeovers against a real partition server: 50 concurrent takeovers of one name get 50
distinct generations, only the newest can renew, the zombie is fenced as soon as the
takeover answers, the sequence continues, and a partition that lost the PID's state
answers UNKNOWN_PID rather than sequence 0."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pidlease import errors
from pidlease.testing.devcluster import LocalCluster, http_json
from pidlease.testing.http import run_many
from pidlease.testing.wire import WireClient
from pidlease.wire import protocol as P
from tests.helpers import lease_pid


def produce(
    w: WireClient,
    lease_body: dict[str, Any],
    partition: int,
    seq: int,
    n: int = 1,
    generation: int | None = None,
    token: str | None = None,
) -> P.Response:
    batch = P.encode_batch(
        [(None, b"v%d" % (seq + i)) for i in range(n)],
        pid=lease_body["pid"],
        generation=lease_body["generation"] if generation is None else generation,
        base_sequence=seq,
        timestamp_ms=int(time.time() * 1000),
    )
    return w.produce(
        "orders", partition, batch, lease_body["lease_token"] if token is None else token
    )


def test_50_concurrent_takeovers_get_50_distinct_generations(make_cluster: Any) -> None:
    cluster: LocalCluster = make_cluster(servers=1)
    cluster.create_topic("orders", 1)
    status, first = lease_pid(cluster, producer_name="job")
    assert status == 200 and first["kind"] == "new"
    w = WireClient(cluster.servers[0].address)
    try:
        assert produce(w, first, 0, 0, n=3).error_code == errors.NONE

        body = {"topic": "orders", "partition": 0, "pid": -1, "producer_name": "job"}
        replies = asyncio.run(run_many(cluster.coordinator_url, [body] * 50, connections=50))
        generations = []
        for r in replies:
            # A takeover whose FENCE reached the partition after a newer one was told so
            # (FENCED, with the generation it had been given); the rest succeeded.
            assert (r.status, r.body["error"]) in ((200, "NONE"), (409, "FENCED")), r.body
            assert r.body.get("pid", first["pid"]) == first["pid"]
            generations.append(r.body["generation"])
        assert len(set(generations)) == 50
        assert sorted(generations) == list(range(first["generation"] + 1, first["generation"] + 51))
        newest = max(generations)

        status, renewed = lease_pid(cluster, pid=first["pid"], generation=newest)
        assert status == 200 and renewed["kind"] == "renew"
        assert renewed["generation"] == newest and renewed["sequence_number"] == 3
        for g in [first["generation"], *generations]:
            if g == newest:
                continue
            status, body = lease_pid(cluster, pid=first["pid"], generation=g)
            assert (status, body["error"]) == (409, "FENCED"), (g, body)

        # The original producer is a zombie now: the partition refuses it.
        assert produce(w, first, 0, 3).error_code == errors.ProducerFenced.code
        assert produce(w, renewed, 0, 3).error_code == errors.NONE
    finally:
        w.sock.close()


def test_takeover_fences_every_partition_before_answering(make_cluster: Any) -> None:
    cluster: LocalCluster = make_cluster(servers=1)
    cluster.create_topic("orders", 2)
    _, a = lease_pid(cluster, producer_name="etl", partition=0)
    status, a1 = lease_pid(cluster, pid=a["pid"], generation=a["generation"], partition=1)
    assert status == 200 and a1["sequence_number"] == 0
    w = WireClient(cluster.servers[0].address)
    try:
        assert produce(w, a, 0, 0, n=5).error_code == errors.NONE
        assert produce(w, a1, 1, 0, n=2).error_code == errors.NONE

        status, b = lease_pid(cluster, producer_name="etl", partition=1)
        assert status == 200 and b["kind"] == "takeover" and b["pid"] == a["pid"]
        assert b["generation"] == a["generation"] + 1
        assert b["sequence_number"] == 2, "continues after what the old holder wrote"
        # Before the new holder appended anything, the zombie is refused on both partitions.
        assert produce(w, a1, 0, 5).error_code == errors.ProducerFenced.code
        assert produce(w, a1, 1, 2).error_code == errors.ProducerFenced.code
        status, b0 = lease_pid(cluster, pid=b["pid"], generation=b["generation"], partition=0)
        assert status == 200 and b0["sequence_number"] == 5
        # A takeover by pid (no generation) works the same way.
        status, c = lease_pid(cluster, pid=a["pid"], partition=0)
        assert status == 200 and c["kind"] == "takeover" and c["sequence_number"] == 5
        assert produce(w, b0, 0, 5).error_code == errors.ProducerFenced.code

        status, view = http_json("GET", cluster.coordinator_url + f"/v1/pids/{a['pid']}")
        assert status == 200 and view["generation"] == c["generation"]
        assert {(p["partition"], p["highwater"]) for p in view["partitions"]} == {(0, 4), (1, 1)}
    finally:
        w.sock.close()


def test_partition_that_forgot_the_pid_answers_unknown_pid_not_zero(make_cluster: Any) -> None:
    cluster: LocalCluster = make_cluster(
        servers=1,
        env={
            "PIDLEASE_PID_EXPIRE_MS": "1500",
            "PIDLEASE_ALLOW_SHORT_PID_EXPIRE": "1",
            "PIDLEASE_PID_EXPIRE_CHECK_MS": "100",
        },
    )
    cluster.create_topic("orders", 1)
    _, a = lease_pid(cluster)
    w = WireClient(cluster.servers[0].address)
    try:
        assert produce(w, a, 0, 0, n=2).error_code == errors.NONE
        status, r = lease_pid(cluster, pid=a["pid"], generation=a["generation"])
        assert status == 200 and r["sequence_number"] == 2  # the partition is now "seen"
        # Wait (bounded) until the server has expired the state; METADATA does not touch it.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            parts = w.metadata()["partitions"]
            if sum(p["tracked_pids"] for p in parts) == 0:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the partition server never expired the PID's state")
    finally:
        w.sock.close()
    status, body = lease_pid(cluster, pid=a["pid"], generation=a["generation"])
    assert (status, body["error"]) == (404, "UNKNOWN_PID"), body
    status, body = lease_pid(cluster, pid=a["pid"])  # a takeover must not restart at 0 either
    assert (status, body["error"]) == (404, "UNKNOWN_PID"), body


def test_takeover_after_the_server_expired_an_unseen_partition_is_unknown_pid(
    make_cluster: Any,
) -> None:
    """Issue 12, finding 6: the PID wrote and died before its first renewal, so no leader
    ever reported state for it (the partition is not "seen"); once the server expired it, a
    takeover must not create a fresh entry and answer sequence 0 (a replayable source would
    write its records again), and neither may a renewal. A PID leased and never written is
    still taken over at 0."""
    cluster: LocalCluster = make_cluster(
        servers=1,
        env={
            "PIDLEASE_PID_EXPIRE_MS": "1500",
            "PIDLEASE_ALLOW_SHORT_PID_EXPIRE": "1",
            "PIDLEASE_PID_EXPIRE_CHECK_MS": "100",
        },
    )
    cluster.create_topic("orders", 3)
    # expire_ms below the server's pid_expire_ms: the server keeps state at least that long.
    status, a = lease_pid(cluster, producer_name="replayer", expire_ms=1000)
    assert status == 200 and a["sequence_number"] == 0
    status, r = lease_pid(cluster, partition=2, expire_ms=1000)
    assert status == 200 and r["sequence_number"] == 0
    w = WireClient(cluster.servers[0].address)
    try:
        assert produce(w, a, 0, 0, n=3).error_code == errors.NONE
        assert produce(w, r, 2, 0, n=4).error_code == errors.NONE
        # ... and both producers die here, before their first renewal.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            parts = w.metadata()["partitions"]
            if sum(p["tracked_pids"] for p in parts) == 0:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the partition server never expired the PIDs' state")
    finally:
        w.sock.close()
    status, body = lease_pid(cluster, producer_name="replayer")
    assert (status, body["error"]) == (404, "UNKNOWN_PID"), body
    assert "may have been" in body["detail"]
    status, body = lease_pid(cluster, pid=a["pid"])  # by pid: the same answer, never 0
    assert (status, body["error"]) == (404, "UNKNOWN_PID"), body
    # The renewal path (lapsed, still retained): PRODUCER_STATE finds nothing either.
    status, body = lease_pid(cluster, pid=r["pid"], generation=r["generation"], partition=2)
    assert (status, body["error"]) == (404, "UNKNOWN_PID"), body

    # Positive case: leased, never written, taken over soon after: sequence 0 as before.
    status, b = lease_pid(cluster, producer_name="fresh", partition=1, expire_ms=1000)
    assert status == 200
    status, t = lease_pid(cluster, producer_name="fresh", partition=1)
    assert status == 200, t
    assert (t["kind"], t["pid"], t["sequence_number"]) == ("takeover", b["pid"], 0)
    w = WireClient(cluster.servers[0].address)
    try:
        assert produce(w, t, 1, 0, n=2).error_code == errors.NONE
        assert produce(w, b, 1, 2).error_code == errors.ProducerFenced.code  # the zombie
    finally:
        w.sock.close()
    # A dedup=off topic tracks nothing, so its FENCE never creates an entry either: that
    # alone must not read as "state lost".
    cluster.create_topic("loose", 1, dedup="off")
    status, _ = lease_pid(cluster, topic="loose", producer_name="loose-writer", expire_ms=1000)
    assert status == 200
    status, t = lease_pid(cluster, topic="loose", producer_name="loose-writer")
    assert (status, t["kind"], t["sequence_number"]) == (200, "takeover", 0), t


def test_takeover_never_answers_ok_with_a_leased_partition_left_unfenced(
    make_cluster: Any,
) -> None:
    """Issue 30, item 4: the PID's state expired on partition 1 of a monotonic topic while
    partition 0 stayed in use. A takeover on partition 0 fenced partition 0, got "no state,
    nothing written" from partition 1 (it may not create one: it dropped a PID used since
    this lease began) and answered OK; the old holder then appended to partition 1 with
    the old generation (a monotonic topic takes any sequence from a PID it does not know).
    The takeover must answer UNKNOWN_PID instead, naming the partition it could not fence."""
    cluster: LocalCluster = make_cluster(
        servers=1,
        env={
            "PIDLEASE_PID_EXPIRE_MS": "1500",
            "PIDLEASE_ALLOW_SHORT_PID_EXPIRE": "1",
            "PIDLEASE_PID_EXPIRE_CHECK_MS": "100",
        },
    )
    cluster.create_topic("orders", 2, dedup="monotonic")
    status, a = lease_pid(cluster, producer_name="mono", expire_ms=1000)
    assert status == 200 and a["sequence_number"] == 0
    gen = {"pid": a["pid"], "generation": a["generation"], "expire_ms": 1000}
    status, a1 = lease_pid(cluster, partition=1, **gen)
    assert status == 200 and a1["sequence_number"] == 0
    w = WireClient(cluster.servers[0].address)
    try:
        assert produce(w, a1, 0, 10, n=3).error_code == errors.NONE
        assert produce(w, a1, 1, 10, n=3).error_code == errors.NONE
        for p in (0, 1):  # both partitions are "seen" with highwater 12
            status, r = lease_pid(cluster, partition=p, **gen)
            assert status == 200 and r["sequence_number"] == 13, r
        # Partition 0 stays in use (each renewal touches its state there); partition 1 is
        # left alone until the server expires the PID's state on it (bounded wait).
        deadline = time.monotonic() + 60
        while True:
            status, r = lease_pid(cluster, partition=0, **gen)
            assert status == 200 and r["sequence_number"] == 13, r
            tracked = {p["partition"]: p["tracked_pids"] for p in w.metadata()["partitions"]}
            if tracked == {0: 1, 1: 0}:
                break
            assert time.monotonic() < deadline, f"partition 1 never expired the PID: {tracked}"
            time.sleep(0.3)

        status, t = lease_pid(cluster, producer_name="mono", partition=0)
        assert (status, t["error"]) == (404, "UNKNOWN_PID"), t
        assert "orders/1" in t["detail"], t
        # Partition 0 was fenced all the same: the old holder is refused there.
        assert produce(w, r, 0, 20).error_code == errors.ProducerFenced.code
    finally:
        w.sock.close()
