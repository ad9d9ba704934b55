"""A topic's log settings through a real coordinator on a real ZooKeeper: given at
creation, shown by GET and held by the topic's znode; changed one at a time by PATCH
(the others kept); refused (fixed field, unknown topic, bad value, producer-scope token)
with the right 4xx and the znode untouched; the CLI's create/alter/describe round trip;
and a partition server's registry re-delivering the spec when the znode changes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from partition_server.registry import Assignment, Registry
from pidlease.testing.devcluster import LocalCluster
from pidlease.wire import cluster as layout
from pidlease.wire.cluster import SEGMENT_MS_DEFAULT, TopicSpec, connect_zk
from tests.helpers import cli, wait_until

ADMIN_TOKEN = "settings-admin-token-01"
PRODUCER_TOKEN = "settings-producer-token-01"
DAY_MS = 86_400_000


@pytest.fixture
def secured(make_cluster: Any) -> Iterator[tuple[LocalCluster, Any]]:
    """A one-server cluster with an admin and a producer principal, and a kazoo client on
    its ZooKeeper chroot."""
    c: LocalCluster = make_cluster(
        servers=1,
        env={
            "PIDLEASE_API_TOKENS": f"ops:admin:{ADMIN_TOKEN},app:producer:{PRODUCER_TOKEN}",
        },
    )
    zk = connect_zk(c.zk_hosts)
    yield c, zk
    zk.stop()
    zk.close()


def call(
    c: LocalCluster, method: str, path: str, body: Any = None, token: str = ADMIN_TOKEN
) -> tuple[int, dict[str, Any]]:
    r = httpx.request(
        method,
        c.coordinator_url + path,
        json=body,
        headers={"authorization": f"Bearer {token}"},
        timeout=10,
    )
    return r.status_code, r.json()


def znode(zk: Any, name: str) -> tuple[TopicSpec, int]:
    raw, stat = zk.get(layout.topic_path(name))
    return TopicSpec.from_bytes(raw), stat.version


def test_create_patch_describe_and_refusals(secured: tuple[LocalCluster, Any]) -> None:
    c, zk = secured
    status, created = call(
        c,
        "POST",
        "/v1/topics",
        {
            "name": "logs",
            "partitions": 2,
            "retention_ms": 3 * DAY_MS,
            "retention_bytes": 64 << 20,
            "segment_bytes": 4 << 20,
            "segment_ms": 3_600_000,
            "min_insync_replicas": 1,
        },
    )
    assert status == 200, created
    want = {
        "retention_ms": 3 * DAY_MS,
        "retention_bytes": 64 << 20,
        "segment_bytes": 4 << 20,
        "segment_ms": 3_600_000,
        "min_insync_replicas": 1,
    }
    status, described = call(c, "GET", "/v1/topics/logs", token=PRODUCER_TOKEN)
    assert status == 200 and {k: described[k] for k in want} == want
    assert described["min_insync_replicas_effective"] == 1
    for row in described["partition_states"]:
        assert row["log_start_offset"] == 0 and row["log_end_offset"] == 0
        assert row["high_watermark"] == 0
        assert isinstance(row["size_bytes"], int) and row["size_bytes"] >= -1
    spec, version = znode(zk, "logs")
    assert {k: getattr(spec, k) for k in want} == want

    # Defaults when none is given.
    status, plain = call(c, "POST", "/v1/topics", {"name": "plain", "partitions": 1})
    assert status == 200 and (plain["retention_ms"], plain["retention_bytes"]) == (7 * DAY_MS, -1)
    assert (plain["segment_bytes"], plain["segment_ms"]) == (0, SEGMENT_MS_DEFAULT)

    # PATCH one setting: only it changes, by one znode version.
    status, altered = call(c, "PATCH", "/v1/topics/logs", {"retention_bytes": -1})
    assert status == 200, altered
    assert {k: altered[k] for k in want} == {**want, "retention_bytes": -1}
    spec2, version2 = znode(zk, "logs")
    assert version2 == version + 1
    assert spec2 == TopicSpec(**{**spec.__dict__, "retention_bytes": -1})
    status, two = call(c, "PATCH", "/v1/topics/logs", {"retention_ms": -1, "segment_ms": -1})
    assert status == 200 and (two["retention_ms"], two["segment_ms"]) == (-1, -1)
    status, shown = call(c, "GET", "/v1/topics/logs")
    assert (shown["retention_ms"], shown["segment_ms"], shown["segment_bytes"]) == (-1, -1, 4 << 20)

    # Refusals leave the znode exactly as it was.
    before = zk.get(layout.topic_path("logs"))
    for body, status_want, error in [
        ({"partitions": 8}, 400, "INVALID_REQUEST"),
        ({"dedup": "off"}, 400, "INVALID_REQUEST"),
        ({"retention_ms": 5, "replication_factor": 2}, 400, "INVALID_REQUEST"),
        ({}, 400, "INVALID_REQUEST"),
        ({"retention_ms": 0}, 422, "INVALID_REQUEST"),
        ({"segment_bytes": 1000}, 422, "INVALID_REQUEST"),
        ({"retention_bytes": 2**64}, 422, "INVALID_REQUEST"),
        ({"segment_ms": "1h"}, 422, "INVALID_REQUEST"),
        ({"min_insync_replicas": 2}, 400, "INVALID_REQUEST"),  # over replication factor 1
    ]:
        status, body_out = call(c, "PATCH", "/v1/topics/logs", body)
        assert (status, body_out["error"]) == (status_want, error), (body, body_out)
    status, body_out = call(c, "PATCH", "/v1/topics/nope", {"retention_ms": 5})
    assert (status, body_out["error"]) == (404, "UNKNOWN_TOPIC_OR_PARTITION")
    status, body_out = call(c, "PATCH", "/v1/topics/logs", {"retention_ms": 5}, PRODUCER_TOKEN)
    assert (status, body_out["error"]) == (403, "FORBIDDEN")
    assert body_out["needed_scope"] == "admin"
    status, body_out = call(c, "PATCH", "/v1/topics/logs", {"retention_ms": 5}, "wrong-token-x")
    assert (status, body_out["error"]) == (401, "UNAUTHORIZED")
    after = zk.get(layout.topic_path("logs"))
    assert (after[0], after[1].version) == (before[0], before[1].version)

    # Concurrent PATCHes of different settings: each is a compare-and-set on the znode
    # version, so none overwrites another with the value it read.
    for round_ in range(3):
        targets = {
            "retention_ms": 1000 + round_,
            "retention_bytes": 5000 + round_,
            "segment_bytes": 8192 + round_,
            "segment_ms": 2000 + round_,
            "min_insync_replicas": 1,
        }
        with ThreadPoolExecutor(len(targets)) as pool:
            answers = list(
                pool.map(
                    lambda kv: call(c, "PATCH", "/v1/topics/logs", dict([kv])), targets.items()
                )
            )
        assert all(status == 200 for status, _ in answers), answers
        spec3, _ = znode(zk, "logs")
        assert {k: getattr(spec3, k) for k in targets} == targets

    # Creation refuses bad settings, naming the field, and creates nothing.
    status, body_out = call(
        c, "POST", "/v1/topics", {"name": "bad", "partitions": 1, "segment_bytes": 10}
    )
    assert (status, body_out["error"]) == (422, "INVALID_REQUEST")
    assert "segment_bytes" in body_out["detail"]
    assert zk.exists(layout.topic_path("bad")) is None


def test_cli_create_alter_describe(secured: tuple[LocalCluster, Any]) -> None:
    c, zk = secured
    url = c.coordinator_url
    auth = ("--api-token", ADMIN_TOKEN)
    r = cli(
        "topic",
        "create",
        "clitopic",
        "--retention",
        "7d",
        "--retention-bytes",
        "1GiB",
        "--segment-bytes",
        "256MiB",
        "--segment-ms",
        "1h",
        "--min-insync-replicas",
        "1",
        *auth,
        url=url,
    )
    assert r.returncode == 0, r.stderr
    assert "retention 7d, retention bytes 1GiB per partition, segment bytes 256MiB" in r.stdout
    spec, _ = znode(zk, "clitopic")
    assert (spec.retention_ms, spec.retention_bytes, spec.segment_bytes) == (
        7 * DAY_MS,
        1 << 30,
        256 << 20,
    )
    assert (spec.segment_ms, spec.min_insync_replicas) == (3_600_000, 1)

    r = cli(
        "topic",
        "alter",
        "clitopic",
        "--retention",
        "forever",
        "--segment-ms",
        "never",
        *auth,
        url=url,
    )
    assert r.returncode == 0, r.stderr
    assert "retention forever" in r.stdout and "segment age never" in r.stdout
    spec2, _ = znode(zk, "clitopic")
    assert (spec2.retention_ms, spec2.segment_ms, spec2.retention_bytes) == (-1, -1, 1 << 30)

    r = cli("topic", "describe", "clitopic", *auth, url=url)
    assert r.returncode == 0, r.stderr
    assert "retention forever, retention bytes 1GiB per partition" in r.stdout
    assert "LOG_START" in r.stdout and "SIZE" in r.stdout
    assert "DELETED" in r.stdout and "0 (0B)" in r.stdout  # nothing deleted yet
    described = json.loads(cli("topic", "describe", "clitopic", "--json", *auth, url=url).stdout)
    assert described["retention_ms"] == -1 and described["segment_bytes"] == 256 << 20

    bad = cli("topic", "alter", "clitopic", "--min-insync-replicas", "3", *auth, url=url)
    assert bad.returncode == 1 and "INVALID_REQUEST" in bad.stderr
    assert "replication_factor 1" in bad.stderr
    assert znode(zk, "clitopic")[0] == spec2


def test_registry_redelivers_a_changed_topic_spec(zk_hosts: str) -> None:
    """A partition server learns a PATCH without a restart: a data change of an existing
    topic znode fires the watch its registry left on it, and the re-read spec reaches
    ``on_change``."""
    zk = connect_zk(zk_hosts)
    try:
        zk.create(layout.topic_path("w"), TopicSpec("w", 1).to_bytes())

        async def go() -> None:
            reg = Registry(zk_hosts, 7)
            seen: list[Assignment] = []
            reg.on_change = seen.append
            await asyncio.get_running_loop().run_in_executor(None, reg.connect)
            try:
                first = await asyncio.wait_for(reg.refresh(), 10)
                assert first.topics["w"].retention_bytes == -1
                zk.set(
                    layout.topic_path("w"), TopicSpec("w", 1, retention_bytes=1 << 20).to_bytes()
                )
                await wait_until(
                    lambda: bool(seen) and seen[-1].topics["w"].retention_bytes == 1 << 20, 10
                )
                # The watch is armed again by the re-read: a second change arrives too.
                zk.set(layout.topic_path("w"), TopicSpec("w", 1, segment_ms=-1).to_bytes())
                await wait_until(lambda: seen[-1].topics["w"].segment_ms == -1, 10)
            finally:
                reg.close()

        asyncio.run(go())
    finally:
        zk.stop()
        zk.close()
