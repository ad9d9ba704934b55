"""After a run against a real cluster, what /metrics says equals what the test did: it
appends N batches, forces K retries of acked batches (each answered DUPLICATE), sends M
batches with a sequence gap, takes the PID over and sends F appends as the zombie with the
old generation, and makes S stale lease requests. The counts are drawn at random per run,
so a hard-coded figure anywhere would not pass twice. The dashboard's JSON and event feed
must tell the same story, and a replicated topic shows its followers' lag."""

from __future__ import annotations

import random
from typing import Any

from partition_server.metrics import sample
from pidlease import errors
from pidlease.testing.devcluster import LocalCluster, http_json
from pidlease.testing.wire import WireClient, batch
from tests.helpers import cli, leased, scrape_metrics, wait_for

WAIT_S = 60


def test_scraped_counters_match_what_the_test_did(make_cluster: Any) -> None:
    rng = random.Random()
    n, k, m, f, s = (
        rng.randint(3, 9),
        rng.randint(1, 5),
        rng.randint(1, 4),
        rng.randint(1, 6),
        rng.randint(1, 3),
    )
    # Forced retries resend k distinct acked batches (answered DUPLICATE): at most n of them.
    k = min(k, n)
    print(f"appends {n}, forced retries {k}, gaps {m}, zombie appends {f}, stale leases {s}")
    cluster: LocalCluster = make_cluster(servers=1)
    cluster.create_topic("m", 1)
    svc = cluster.servers[0]
    before = scrape_metrics(svc.metrics_url)
    assert sample(before, "pidlease_server_fenced_appends_total") == 0

    first = leased(cluster, topic="m", producer_name="counted", expire_ms=600_000)
    pid, gen, tok = first["pid"], first["generation"], first["lease_token"]
    sent = [batch(pid, gen, 2 * i, [b"a%d" % i, b"b%d" % i]) for i in range(n)]
    with WireClient(svc.address) as c:
        acks = [c.produce("m", 0, b, tok) for b in sent]
        assert [a.error_code for a in acks] == [0] * n
        for b in rng.sample(sent, k):  # forced retries of acked batches
            assert c.produce("m", 0, b, tok).error_code == errors.DUPLICATE
        for j in range(m):  # a gap: expected 2n
            r = c.produce("m", 0, batch(pid, gen, 2 * n + 5 + j, [b"gap"]), tok)
            assert r.error_code == errors.OutOfOrderSequence.code
        for _ in range(s):  # stale renewals, refused by the coordinator
            leased(cluster, topic="m", expect=409, pid=pid, generation=gen - 1)
        taken = leased(cluster, topic="m", producer_name="counted", expire_ms=600_000)
        assert taken["kind"] == "takeover" and taken["generation"] == gen + 1
        for _ in range(f):  # the zombie keeps writing
            r = c.produce("m", 0, batch(pid, gen, 2 * n, [b"zombie"]), tok)
            assert r.error_code == errors.ProducerFenced.code

    got = scrape_metrics(svc.metrics_url)
    assert sample(got, "pidlease_server_appended_batches_total") == n
    assert sample(got, "pidlease_server_appended_records_total") == 2 * n
    assert sample(got, "pidlease_server_duplicates_total") == k
    assert sample(got, "pidlease_server_out_of_order_total") == m
    assert sample(got, "pidlease_server_fenced_appends_total") == f
    assert sample(got, "pidlease_server_fences_total") == 1
    assert sample(got, "pidlease_server_append_latency_seconds_count") == n
    assert sample(got, "pidlease_server_append_latency_seconds_bucket", le="+Inf") == n
    assert sample(got, "pidlease_server_tracked_pids") == 1
    assert sample(got, "pidlease_server_tracked_pids_by_partition", topic="m", partition="0") == 1
    assert sample(got, "pidlease_server_partitions", role="leader") == 1
    assert sample(got, "pidlease_server_producer_state_bytes") > 0

    coord = scrape_metrics(cluster.coordinator_url)
    assert sample(coord, "pidlease_leases_total", kind="new") == 1
    assert sample(coord, "pidlease_leases_total", kind="takeover") == 1
    assert sample(coord, "pidlease_takeovers_total") == 1
    assert sample(coord, "pidlease_fences_sent_total") == 1
    assert sample(coord, "pidlease_errors_total", code="FENCED") == s
    assert sample(coord, "pidlease_pid_blocks_fetched_total") == 1

    # The dashboard tells the same story: per-server figures and one event per refusal.
    status, data = http_json("GET", cluster.coordinator_url + "/dashboard/data")
    assert status == 200
    (server,) = data["servers"]
    assert (server["fenced_appends"], server["duplicates"], server["out_of_order"]) == (f, k, m)
    assert server["tracked_pids"] == 1 and server["reachable"]
    kinds = [e["kind"] for e in data["events"] if e.get("pid") == pid]
    assert kinds.count("fenced_append") == f and kinds.count("duplicate") == k
    assert kinds.count("takeover") == 1 and kinds.count("fenced_lease") == s
    assert kinds.count("fence") == 1
    coord = scrape_metrics(cluster.coordinator_url)
    assert sample(coord, "pidlease_pids", state="active") == 1


def test_replicated_topic_reports_follower_lag(make_cluster: Any) -> None:
    cluster: LocalCluster = make_cluster(servers=3)
    cluster.create_topic("r", 1, replication_factor=3)
    _, desc = http_json("GET", cluster.coordinator_url + "/v1/topics/r")
    leader_id = desc["partition_states"][0]["leader"]
    leader = cluster.server(leader_id)
    followers = sorted(set(desc["partition_states"][0]["replicas"]) - {leader_id})

    def caught_up() -> bool:
        got = scrape_metrics(leader.metrics_url)
        try:
            lags = [
                sample(
                    got,
                    "pidlease_server_replica_lag_offsets",
                    topic="r",
                    partition="0",
                    replica=str(r),
                )
                for r in followers
            ]
        except KeyError:
            return False
        return lags == [0, 0] and sample(got, "pidlease_server_under_replicated_partitions") == 0

    wait_for(caught_up, WAIT_S, "both followers caught up", interval_s=0.2)
    for r in followers:
        got = scrape_metrics(cluster.server(r).metrics_url)
        assert sample(got, "pidlease_server_partitions", role="follower") == 1


RETENTION_ENV = {
    "PIDLEASE_FSYNC_INTERVAL_MS": "1",
    "PIDLEASE_RETENTION_CHECK_MS": "100",
    "PIDLEASE_SNAPSHOT_INTERVAL_MS": "200",
}


def test_log_metrics_after_retention_deleted_segments(make_cluster: Any) -> None:
    """Tiny segments and a short retention: once writes stop and every closed segment has
    aged out, /metrics, the topics API and ``topic describe`` agree on the log start, end,
    size and what was deleted, and the size plus the deleted bytes is every byte written."""
    cluster: LocalCluster = make_cluster(servers=1, env=RETENTION_ENV)
    cluster.create_topic("aged", 1, retention_ms=1_500, segment_bytes=4096)
    svc = cluster.servers[0]
    at = {"topic": "aged", "partition": "0"}
    n = random.randint(30, 45)
    lease = leased(cluster, topic="aged", producer_name="ager", expire_ms=600_000)
    pid, gen, tok = lease["pid"], lease["generation"], lease["lease_token"]
    sent = [batch(pid, gen, i, [b"x" * 500]) for i in range(n)]
    with WireClient(svc.address) as c:
        for b in sent:
            assert c.produce("aged", 0, b, tok).error_code == 0

    def settled() -> dict[Any, float] | None:
        got = scrape_metrics(svc.metrics_url)
        try:
            done = sample(got, "pidlease_server_log_segments", **at) == 1
        except KeyError:
            return None
        return got if done else None

    got = wait_for(settled, WAIT_S, "retention to leave only the active segment", interval_s=0.2)
    deleted = sample(got, "pidlease_server_log_segments_deleted_total", **at)
    deleted_bytes = sample(got, "pidlease_server_log_bytes_deleted_total", **at)
    size = sample(got, "pidlease_server_log_size_bytes", **at)
    start = sample(got, "pidlease_server_log_start_offset", **at)
    assert deleted >= 1 and deleted_bytes > 0 and 0 < start < n
    assert sample(got, "pidlease_server_log_end_offset", **at) == n
    assert size + deleted_bytes == sum(len(b) for b in sent)

    _, desc = http_json("GET", cluster.coordinator_url + "/v1/topics/aged")
    row = desc["partition_states"][0]
    assert (row["log_start_offset"], row["log_end_offset"], row["size_bytes"]) == (
        start,
        n,
        size,
    )
    assert (row["segments_deleted"], row["bytes_deleted"]) == (deleted, deleted_bytes)
    # The dashboard's log table reads the same leader METADATA the same way.
    _, data = http_json("GET", cluster.coordinator_url + "/dashboard/data")
    (log_row,) = [x for x in data["logs"] if x["topic"] == "aged"]
    assert log_row["leader"] == svc.ident
    fields = ("log_start_offset", "log_end_offset", "high_watermark", "size_bytes")
    fields += ("segments_deleted", "bytes_deleted")
    assert [log_row[k] for k in fields] == [row[k] for k in fields]
    r = cli("topic", "describe", "aged", url=cluster.coordinator_url)
    assert r.returncode == 0, r.stderr
    assert "DELETED" in r.stdout and f"{int(deleted)} (" in r.stdout
