"""A topic's log settings at the coordinator without ZooKeeper: the schema's bounds, types
and huge numbers on ``POST /v1/topics`` and ``PATCH /v1/topics/{name}`` (a refused call
names the field and changes nothing), the compare-and-set of a PATCH against a concurrent
writer, and the per-partition log columns read from a leader's METADATA."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.app import Coordinator, create_app
from coordinator.schemas import LOG_SETTINGS, TopicAlterBody, TopicBody
from coordinator.settings import CoordinatorSettings
from coordinator.testing import FakeStore
from coordinator.topics import ALTER_ATTEMPTS, Topics, log_from_metadata
from pidlease.errors import CoordinatorUnavailable, InvalidRequest, UnknownTopicOrPartition
from pidlease.wire import cluster
from pidlease.wire.cluster import RETENTION_MS_DEFAULT, SEGMENT_MS_DEFAULT, TopicSpec
from tests.unit.coordinator.test_app import TestClient

GiB = 1 << 30
BAD_VALUES: list[tuple[str, Any]] = [
    ("retention_ms", 0),
    ("retention_ms", -2),
    ("retention_ms", "7d"),
    ("retention_ms", "1000"),
    ("retention_ms", 1000.0),
    ("retention_ms", True),
    ("retention_ms", 2**63),
    ("retention_ms", 2**64 + 5),
    ("retention_ms", 10**400),
    ("retention_bytes", 0),
    ("retention_bytes", -5),
    ("retention_bytes", 2**63),
    ("retention_bytes", [1]),
    ("segment_bytes", -1),
    ("segment_bytes", 1),
    ("segment_bytes", 4095),
    ("segment_bytes", GiB + 1),
    ("segment_bytes", 2**70),
    ("segment_ms", 0),
    ("segment_ms", -2),
    ("segment_ms", 2**63),
    ("min_insync_replicas", -1),
    ("min_insync_replicas", 17),
    ("min_insync_replicas", "2"),
]


class Spy(FakeStore):
    """FakeStore whose topic compare-and-set lets ``rivals`` other writers in first: each
    of them changes the topic (segment_ms + 1) just before our write lands."""

    def __init__(self, rivals: int = 0) -> None:
        super().__init__()
        self.rivals = rivals
        self.cas_calls = 0

    def cas_topic(self, spec: TopicSpec, version: int) -> bool:
        self.cas_calls += 1
        if self.rivals:
            self.rivals -= 1
            cur, v = self.get_topic_versioned(spec.name) or (spec, version)
            cur.segment_ms += 1
            assert super().cas_topic(cur, v)
        return super().cas_topic(spec, version)


def stored(store: FakeStore, name: str = "t") -> TopicSpec:
    got = store.get_topic(name)
    assert got is not None
    return got


@pytest.fixture
def app_and_store() -> tuple[TestClient, FakeStore]:
    s = CoordinatorSettings(zk="127.0.0.1:1/none", request_bytes_max=4096)
    coord = Coordinator(s)
    store = FakeStore()
    store.add_topic("t", 2)
    coord.topics = Topics(store, None, lambda: 0)  # type: ignore[arg-type]
    return TestClient(create_app(coordinator=coord, start=False)), store


# -- the schema ------------------------------------------------------------------------------
def test_creation_defaults_match_the_spec_defaults() -> None:
    body = TopicBody.model_validate({"name": "t", "partitions": 1})
    assert body.log_settings() == {
        "retention_ms": RETENTION_MS_DEFAULT,
        "retention_bytes": -1,
        "segment_bytes": 0,
        "segment_ms": SEGMENT_MS_DEFAULT,
        "min_insync_replicas": 0,
    }
    spec = TopicSpec("t", 1)
    assert body.log_settings() == {f: getattr(spec, f) for f in LOG_SETTINGS}


@pytest.mark.parametrize(
    "settings",
    [
        {"retention_ms": -1, "retention_bytes": -1, "segment_ms": -1},
        {"retention_ms": 1, "retention_bytes": 1, "segment_ms": 1},
        {"retention_ms": 2**63 - 1, "retention_bytes": 2**63 - 1, "segment_ms": 2**63 - 1},
        {"segment_bytes": 0},
        {"segment_bytes": 4096},
        {"segment_bytes": GiB},
        {"min_insync_replicas": 0},
        {"min_insync_replicas": 3},
    ],
)
def test_good_values_pass(settings: dict[str, int]) -> None:
    body = TopicBody.model_validate(
        {"name": "t", "partitions": 1, "replication_factor": 3, **settings}
    )
    assert {k: getattr(body, k) for k in settings} == settings
    assert TopicAlterBody.model_validate(settings).changes() == settings


@pytest.mark.parametrize(("field", "value"), BAD_VALUES)
def test_create_refuses_a_bad_value_naming_the_field(
    app_and_store: tuple[TestClient, FakeStore], field: str, value: Any
) -> None:
    client, _ = app_and_store
    r = client.post("/v1/topics", json={"name": "new", "partitions": 1, field: value})
    assert 400 <= r.status_code < 500, r.text
    body = r.json()
    assert body["error"] == "INVALID_REQUEST"
    assert field in body["detail"], body


def test_create_refuses_min_insync_over_the_replication_factor(
    app_and_store: tuple[TestClient, FakeStore],
) -> None:
    client, _ = app_and_store
    r = client.post(
        "/v1/topics",
        json={"name": "new", "partitions": 1, "replication_factor": 2, "min_insync_replicas": 3},
    )
    assert (r.status_code, r.json()["error"]) == (422, "INVALID_REQUEST")
    assert "min_insync_replicas 3 is more than replication_factor 2" in r.json()["detail"]


# -- PATCH -----------------------------------------------------------------------------------
def test_patch_changes_only_the_named_settings(
    app_and_store: tuple[TestClient, FakeStore],
) -> None:
    client, store = app_and_store
    before = stored(store)
    r = client.request("PATCH", "/v1/topics/t", json={"retention_ms": 3_600_000})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "error": "NONE",
        "name": "t",
        "retention_ms": 3_600_000,
        "retention_bytes": -1,
        "segment_bytes": 0,
        "segment_ms": SEGMENT_MS_DEFAULT,
        "min_insync_replicas": 0,
        "min_insync_replicas_effective": 1,
    }
    after = stored(store)
    assert after.retention_ms == 3_600_000
    after.retention_ms = before.retention_ms
    assert after == before


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({}, 400, "nothing to change"),
        (None, 400, "nothing to change"),
        ({"partitions": 4}, 400, "partitions cannot be changed"),
        ({"dedup": "off", "retention_ms": 5}, 400, "dedup cannot be changed"),
        ({"replication_factor": 3}, 400, "replication_factor cannot be changed"),
        ({"name": "u"}, 400, "name cannot be changed"),
        ({"retention": 5}, 400, "retention cannot be changed"),
        ({"retention_ms": None}, 422, "retention_ms"),
        ({"retention_ms": 0}, 422, "retention_ms"),
        ({"segment_bytes": 100}, 422, "segment_bytes"),
        ({"segment_ms": 2**64}, 422, "segment_ms"),
        ({"retention_bytes": "1GiB"}, 422, "retention_bytes"),
        ({"min_insync_replicas": 2}, 400, "replication_factor 1"),
    ],
)
def test_patch_refusals_change_nothing(
    app_and_store: tuple[TestClient, FakeStore], body: Any, status: int, says: str
) -> None:
    client, store = app_and_store
    before = store.nodes[cluster.topic_path("t")]
    r = client.request("PATCH", "/v1/topics/t", json=body)
    assert (r.status_code, r.json()["error"]) == (status, "INVALID_REQUEST"), r.text
    assert says in r.json()["detail"]
    assert store.nodes[cluster.topic_path("t")] == before


def test_patch_of_a_body_that_is_not_an_object(
    app_and_store: tuple[TestClient, FakeStore],
) -> None:
    client, _ = app_and_store
    r = client.request("PATCH", "/v1/topics/t", json=[1, 2])
    assert 400 <= r.status_code < 500 and r.json()["error"] == "INVALID_REQUEST"
    r = client.request(
        "PATCH",
        "/v1/topics/t",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert (r.status_code, r.json()["error"]) == (400, "INVALID_REQUEST")


def test_patch_of_an_unknown_or_misnamed_topic(
    app_and_store: tuple[TestClient, FakeStore],
) -> None:
    client, _ = app_and_store
    r = client.request("PATCH", "/v1/topics/nope", json={"retention_ms": 5})
    assert (r.status_code, r.json()["error"]) == (404, "UNKNOWN_TOPIC_OR_PARTITION")
    r = client.request("PATCH", "/v1/topics/a%20b", json={"retention_ms": 5})
    assert (r.status_code, r.json()["error"]) == (400, "INVALID_REQUEST")


def test_alter_retries_past_concurrent_writers_and_keeps_their_change() -> None:
    store = Spy(rivals=3)
    store.add_topic("t", 1)
    topics = Topics(store, None, lambda: 0)  # type: ignore[arg-type]
    out = topics.alter("t", {"retention_bytes": 1 << 20})
    spec = stored(store)
    assert store.cas_calls == 4
    assert (spec.retention_bytes, spec.segment_ms) == (1 << 20, SEGMENT_MS_DEFAULT + 3)
    assert out["retention_bytes"] == 1 << 20 and out["segment_ms"] == SEGMENT_MS_DEFAULT + 3


def test_alter_gives_up_after_bounded_attempts() -> None:
    store = Spy(rivals=10**6)
    store.add_topic("t", 1)
    topics = Topics(store, None, lambda: 0)  # type: ignore[arg-type]
    with pytest.raises(CoordinatorUnavailable, match="attempts in a row"):
        topics.alter("t", {"retention_ms": 5})
    assert store.cas_calls == ALTER_ATTEMPTS
    assert stored(store).retention_ms == RETENTION_MS_DEFAULT


def test_alter_without_a_change_writes_nothing() -> None:
    store = Spy()
    store.add_topic("t", 1)
    topics = Topics(store, None, lambda: 0)  # type: ignore[arg-type]
    topics.alter("t", {"retention_bytes": -1})
    assert store.cas_calls == 0
    with pytest.raises(InvalidRequest, match="only retention_ms"):
        topics.alter("t", {})
    with pytest.raises(InvalidRequest, match="not partitions"):
        topics.alter("t", {"partitions": 3})
    with pytest.raises(UnknownTopicOrPartition):
        topics.alter("u", {"retention_ms": 5})


# -- the log columns -------------------------------------------------------------------------
def test_log_columns_from_metadata() -> None:
    new = {
        "partitions": [
            {
                "topic": "t",
                "partition": 0,
                "log_start_offset": 40,
                "log_end_offset": 90,
                "high_watermark": 80,
                "size_bytes": 5000,
            }
        ]
    }
    assert log_from_metadata(new, "t", 0) == {
        "log_start_offset": 40,
        "log_end_offset": 90,
        "high_watermark": 80,
        "size_bytes": 5000,
    }
    # A server that does not report the log start or size yet: nothing deleted, size unknown.
    old = {"partitions": [{"topic": "t", "partition": 0, "log_end_offset": 7}]}
    assert log_from_metadata(old, "t", 0) == {
        "log_start_offset": 0,
        "log_end_offset": 7,
        "high_watermark": 7,
        "size_bytes": -1,
    }
    unknown = dict.fromkeys(
        ("log_start_offset", "log_end_offset", "high_watermark", "size_bytes"), -1
    )
    assert log_from_metadata(None, "t", 0) == unknown
    assert log_from_metadata(new, "t", 1) == unknown
    odd = {"partitions": {"t/0": {"log_end_offset": True, "size_bytes": "big"}}}
    assert log_from_metadata(odd, "t", 0) == {**unknown, "log_start_offset": 0}
    # Retention's counters show only when the leader reports them (as counts).
    counted = {"partitions": [{**new["partitions"][0], "segments_deleted": 3, "bytes_deleted": 9}]}
    assert log_from_metadata(counted, "t", 0) == {
        **log_from_metadata(new, "t", 0),
        "segments_deleted": 3,
        "bytes_deleted": 9,
    }
    bad = {"partitions": {"t/0": {"segments_deleted": -2, "bytes_deleted": False}}}
    assert "segments_deleted" not in log_from_metadata(bad, "t", 0)
    assert "bytes_deleted" not in log_from_metadata(bad, "t", 0)


def test_describe_without_offsets_asks_no_partition_server() -> None:
    """``GET /v1/topics/{name}?offsets=false`` (what producers and readers use to find
    leaders) is ZooKeeper only: a leader that does not answer cannot hold it up. With
    offsets (the default, `topic describe`) each leader is asked for METADATA."""

    class Leaders:
        calls = 0

        def metadata(self, address: str) -> Any:
            Leaders.calls += 1
            raise CoordinatorUnavailable(f"{address} does not answer")

    s = CoordinatorSettings(zk="127.0.0.1:1/none")
    coord = Coordinator(s)
    store = FakeStore()
    store.add_topic("t", 2)
    store.add_server(1, 9001)
    coord.topics = Topics(store, Leaders(), lambda: 0)  # type: ignore[arg-type]
    client = TestClient(create_app(coordinator=coord, start=False))
    r = client.get("/v1/topics/t?offsets=false")
    assert r.status_code == 200 and Leaders.calls == 0
    assert [p["leader"] for p in r.json()["partition_states"]] == [1, 1]
    r = client.get("/v1/topics/t")
    assert r.status_code == 200 and Leaders.calls == 1
    assert r.json()["partition_states"][0]["log_end_offset"] == -1  # unknown, not an error
    assert client.get("/v1/topics/t?offsets=maybe").status_code == 422


def test_describe_pages_a_topic_of_many_partitions() -> None:
    """``GET /v1/topics/{name}?first=&count=`` (``pidlease topic describe --from --limit``):
    a page of a topic of 10,000 partitions, the rest untouched; past the end, empty; a
    negative start or an empty page, 422."""

    class Leaders:
        def metadata(self, address: str) -> Any:
            raise CoordinatorUnavailable(f"{address} does not answer")

    coord = Coordinator(CoordinatorSettings(zk="127.0.0.1:1/none"))
    store = FakeStore()
    store.add_topic("t", 10_000)
    store.add_server(1, 9001)
    coord.topics = Topics(store, Leaders(), lambda: 0)  # type: ignore[arg-type]
    client = TestClient(create_app(coordinator=coord, start=False))
    body = client.get("/v1/topics/t?offsets=false&first=9990&count=100").json()
    assert [p["partition"] for p in body["partition_states"]] == list(range(9990, 10_000))
    assert body["partitions"] == 10_000 and body["first_partition"] == 9990
    body = client.get("/v1/topics/t?offsets=false&first=20&count=5").json()
    assert [p["partition"] for p in body["partition_states"]] == [20, 21, 22, 23, 24]
    assert client.get("/v1/topics/t?offsets=false&first=10000").json()["partition_states"] == []
    whole = client.get("/v1/topics/t?offsets=false").json()
    assert len(whole["partition_states"]) == 10_000 and "first_partition" not in whole
    assert client.get("/v1/topics/t?first=-1").status_code == 422
    assert client.get("/v1/topics/t?count=0").status_code == 422


def test_producers_and_readers_look_leaders_up_without_offsets() -> None:
    """The SDK's leader lookups ask for ``offsets=false``; `topic describe` does not."""
    import httpx

    from pidlease.client.lease_client import LeaseClient
    from pidlease.testing.fakes import fake_cluster

    seen: list[str] = []
    with fake_cluster({"t": (1, "strict")}) as (_srv, fake):
        handle = fake.transport()

        def spy(request: httpx.Request) -> httpx.Response:
            seen.append(str(request.url))
            return handle.handle_request(request)

        with LeaseClient("http://c", transport=httpx.MockTransport(spy)) as lc:
            lc.topic("t", offsets=False)
            lc.topic("t")
    assert seen[0].endswith("/v1/topics/t?offsets=false")
    assert seen[1].endswith("/v1/topics/t")
