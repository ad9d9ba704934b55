"""Fuzzing the Kafka admin APIs against a real partition server (issue 25): hypothesis
builds CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs, AlterConfigs and
IncrementalAlterConfigs requests from odd names, counts, config names, values and
operations, at every advertised version, plus byte-level mutations of them. Every request
is answered in its own shape (or, for mutated bytes, answered or closed), the server keeps
serving, and ZooKeeper stays consistent: every topic's spec reads back with valid settings
and exactly its partitions' znodes, and the topic no request may name keeps its records
and its settings. Example count: ``PIDLEASE_FUZZ_EXAMPLES`` (default 300 here: 120)."""

from __future__ import annotations

import datetime as dt
import os
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kazoo.client import KazooClient

from partition_server.kafka import codec as C
from partition_server.kafka import configs as CF
from pidlease.testing.devcluster import LocalCluster
from pidlease.wire.cluster import LOG_SETTINGS, TopicSpec, log_setting_problem
from tests.kafka_wire import KafkaWire, fetch_values, produce_values, record_batch

EXAMPLES = max(40, int(os.environ.get("PIDLEASE_FUZZ_EXAMPLES", "300")) * 2 // 5)
KEEP = "keep"  # no request names it
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=True,  # the same examples every run: CI time and coverage stay put
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# mostly a small pool of names, so creates, growths, alters and deletes meet the same
# topics; sometimes garbage
pool = st.sampled_from(["a", "b", "c"])
odd = st.sampled_from(["x" * 250, "", "-", "..", "a/b", "ü"]) | st.text("abc-_.", max_size=4)
names = st.one_of(pool, pool, pool, odd).filter(lambda n: n != KEEP)
config_names = st.one_of(
    st.sampled_from(CF.KNOWN),
    st.sampled_from(CF.KNOWN),
    st.sampled_from(["compression.type", "", "retention.ms "]),
)
config_values = st.one_of(
    st.integers(-2, 10**7).map(str),
    st.sampled_from(["1", "4096", "1048576", "2", "delete", "strict", "monotonic"]),
    st.none() | st.sampled_from(["99999999999999999999", "x", "", " 7 ", "off", "compact"]),
)
# (at most 12 partitions: a server opens a topic's new partitions in one go, and a
# thousand at a time stalls it for seconds, long enough to miss ZooKeeper pings here)
counts = st.one_of(
    st.integers(1, 12),
    st.integers(1, 12),
    st.integers(-3, 0),
    st.sampled_from([2**31 - 1, 10_001, -(2**31)]),
)
resource_types = st.one_of(st.just(2), st.just(2), st.integers(-1, 5))
operations = st.one_of(st.just(0), st.just(1), st.integers(-1, 4))
replication = st.one_of(st.just(1), st.just(-1), st.integers(-2, 3))


def request(key: int) -> st.SearchStrategy[tuple[int, int, dict[str, Any]]]:
    lo, hi = C.SUPPORTED[key]
    version = st.integers(lo, hi)
    if key == C.CREATE_TOPICS:
        body = st.fixed_dictionaries(
            {
                "topics": st.lists(
                    st.fixed_dictionaries(
                        {
                            "name": names,
                            "num_partitions": counts,
                            "replication_factor": replication,
                            "configs": st.lists(
                                st.fixed_dictionaries(
                                    {"name": config_names, "value": config_values}
                                ),
                                max_size=3,
                            ),
                        }
                    ),
                    max_size=3,
                ),
                "timeout": st.just(dt.timedelta(seconds=5)),
                "validate_only": st.sampled_from([False, False, True]),
            }
        )
    elif key == C.DELETE_TOPICS:
        body = st.fixed_dictionaries(
            {
                "topic_names": st.lists(names, max_size=3),
                "topics": st.lists(
                    st.fixed_dictionaries({"name": st.none() | names, "topic_id": st.uuids()}),
                    max_size=3,
                ),
                "timeout": st.just(dt.timedelta(seconds=5)),
            }
        )
    elif key == C.CREATE_PARTITIONS:
        body = st.fixed_dictionaries(
            {
                "topics": st.lists(
                    st.fixed_dictionaries(
                        {
                            "name": names,
                            "count": counts,
                            "assignments": st.none()
                            | st.none()
                            | st.lists(
                                st.fixed_dictionaries(
                                    {"broker_ids": st.lists(st.integers(-1, 3), max_size=2)}
                                ),
                                max_size=2,
                            ),
                        }
                    ),
                    max_size=3,
                ),
                "timeout": st.just(dt.timedelta(seconds=5)),
                "validate_only": st.sampled_from([False, False, True]),
            }
        )
    elif key == C.DESCRIBE_CONFIGS:
        body = st.fixed_dictionaries(
            {
                "resources": st.lists(
                    st.fixed_dictionaries(
                        {
                            "resource_type": resource_types,
                            "resource_name": names | st.just(KEEP),
                            "configuration_keys": st.none() | st.lists(config_names, max_size=3),
                        }
                    ),
                    max_size=3,
                ),
            }
        )
    else:  # AlterConfigs / IncrementalAlterConfigs
        body = st.fixed_dictionaries(
            {
                "resources": st.lists(
                    st.fixed_dictionaries(
                        {
                            "resource_type": resource_types,
                            "resource_name": names,
                            "configs": st.lists(
                                st.fixed_dictionaries(
                                    {
                                        "name": config_names,
                                        "value": config_values,
                                        "config_operation": operations,
                                    }
                                ),
                                max_size=3,
                            ),
                        }
                    ),
                    max_size=3,
                ),
                "validate_only": st.sampled_from([False, False, True]),
            }
        )
    return st.tuples(st.just(key), version, body)


ADMIN = [
    C.CREATE_TOPICS,
    C.DELETE_TOPICS,
    C.CREATE_PARTITIONS,
    C.DESCRIBE_CONFIGS,
    C.ALTER_CONFIGS,
    C.INCREMENTAL_ALTER_CONFIGS,
]
# weighted towards the writes that make topics for the others to meet
requests = st.one_of(
    [request(k) for k in [*ADMIN, C.CREATE_TOPICS, C.CREATE_TOPICS, C.CREATE_PARTITIONS]]
)


@pytest.fixture(scope="module")
def cluster(make_module_cluster: Any) -> LocalCluster:
    c: LocalCluster = make_module_cluster(servers=1)
    with KafkaWire(c.servers[0].kafka_address) as w:
        r = w.request(
            C.CREATE_TOPICS,
            5,
            {
                "topics": [
                    {
                        "name": KEEP,
                        "num_partitions": 1,
                        "replication_factor": 1,
                        "configs": [{"name": "retention.ms", "value": "123456"}],
                    }
                ],
                "timeout": dt.timedelta(seconds=10),
            },
        )
        assert r.topics[0].error_code == 0
        r = w.request(C.PRODUCE, 9, produce_values(KEEP, 0, record_batch([b"k1", b"k2"])))
        assert r.responses[0].partition_responses[0].error_code == 0
    return c


def consistent(c: LocalCluster) -> None:
    """ZooKeeper after the fuzzing: every topic readable, valid, with exactly its
    partitions; KEEP untouched; the server alive and serving KEEP's records."""
    zk = KazooClient(hosts=c.zk_hosts)
    zk.start(timeout=10)
    try:
        for name in zk.get_children("/topics"):
            raw, _ = zk.get(f"/topics/{name}")
            spec = TopicSpec.from_bytes(raw)
            for field in LOG_SETTINGS:
                assert log_setting_problem(field, getattr(spec, field)) is None, (name, spec)
            assert spec.min_insync_replicas <= spec.replication_factor, spec
            parts = zk.get_children(f"/topics/{name}/partitions")
            assert sorted(map(int, parts)) == list(range(spec.partitions)), (name, spec, parts)
        keep = TopicSpec.from_bytes(zk.get(f"/topics/{KEEP}")[0])
        assert (keep.partitions, keep.retention_ms) == (1, 123456)
    finally:
        zk.stop()
        zk.close()
    assert c.servers[0].alive, c.logs(40)
    with KafkaWire(c.servers[0].kafka_address) as w:
        r = w.request(C.FETCH, 11, fetch_values(KEEP, 0, 0))
        assert r.responses[0].partitions[0].high_watermark == 2


def test_fuzzed_admin_requests_are_answered_and_leave_zookeeper_consistent(
    cluster: LocalCluster,
) -> None:
    w = KafkaWire(cluster.servers[0].kafka_address, timeout_s=30)
    for name in ("a", "b", "c"):  # topics for the requests to meet (the pool's names)
        w.request(
            C.CREATE_TOPICS,
            5,
            {
                "topics": [{"name": name, "num_partitions": 1, "replication_factor": 1}],
                "timeout": dt.timedelta(seconds=10),
            },
        )

    @FUZZ
    @given(req=requests)
    def one(req: tuple[int, int, dict[str, Any]]) -> None:
        key, version, values = req
        r = w.request(key, version, values)  # decodes in the version's response shape
        items = (
            getattr(r, "topics", None)
            or getattr(r, "responses", None)
            or getattr(r, "results", None)
            or ()
        )
        for item in items:
            assert int(item.error_code) in _ANSWERABLE, (key, version, values, item)
            SEEN[(key, int(item.error_code))] = SEEN.get((key, int(item.error_code)), 0) + 1

    try:
        one()
    finally:
        w.close()
    print("answers (api, code): count", sorted(SEEN.items()))
    # the fuzzing reached the writes, not only the refusals
    writes = [k for k in ADMIN if k != C.DESCRIBE_CONFIGS and SEEN.get((k, 0))]
    assert len(writes) >= 3, SEEN
    consistent(cluster)


SEEN: dict[tuple[int, int], int] = {}
# every code an admin request may answer an item with
_ANSWERABLE = {0, 3, 17, 29, 35, 36, 37, 38, 40, 42, 100}


def test_mutated_admin_frames_are_answered_or_closed(cluster: LocalCluster) -> None:
    rng = random.Random(2525)
    addr = cluster.servers[0].kafka_address
    with KafkaWire(addr) as w:
        seeds = [
            w.frame(C.DELETE_TOPICS, 6, {"topics": [{"name": "zz"}], "timeout": dt.timedelta(0)}),
            w.frame(C.DELETE_TOPICS, 1, {"topic_names": ["zz"], "timeout": dt.timedelta(0)}),
            w.frame(
                C.CREATE_PARTITIONS,
                3,
                {"topics": [{"name": "zz", "count": 3}], "timeout": dt.timedelta(0)},
            ),
            w.frame(
                C.INCREMENTAL_ALTER_CONFIGS,
                1,
                {
                    "resources": [
                        {
                            "resource_type": 2,
                            "resource_name": "zz",
                            "configs": [{"name": "retention.ms", "value": "5"}],
                        }
                    ]
                },
            ),
            w.frame(
                C.DESCRIBE_CONFIGS, 4, {"resources": [{"resource_type": 2, "resource_name": KEEP}]}
            ),
        ]
    for i in range(120):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(4, len(data))
            data[at] = rng.randrange(256)
        with KafkaWire(addr, timeout_s=10) as w:
            w.send_raw(bytes(data))
            w.sock.shutdown(1)
            assert w.closed_by_peer(15), f"case {i}: the connection neither answered nor closed"
    consistent(cluster)


def test_names_that_are_paths_name_no_topic(cluster: LocalCluster) -> None:
    """A topic name is a ZooKeeper path segment: "keep/partitions/0" must not name the
    partition znode of "keep", nor ".." a parent. Each is UNKNOWN_TOPIC_OR_PARTITION."""
    paths = [f"{KEEP}/partitions/0", f"{KEEP}/partitions", "..", f"../topics/{KEEP}"]
    with KafkaWire(cluster.servers[0].kafka_address) as w:
        r = w.request(C.DELETE_TOPICS, 5, {"topic_names": paths, "timeout": dt.timedelta(0)})
        assert [int(t.error_code) for t in r.responses] == [3, 3, 3, 3], r
        r = w.request(
            C.CREATE_PARTITIONS,
            3,
            {"topics": [{"name": f"{KEEP}/partitions", "count": 5}], "timeout": dt.timedelta(0)},
        )
        assert int(r.results[0].error_code) == 3, r
        r = w.request(
            C.INCREMENTAL_ALTER_CONFIGS,
            1,
            {
                "resources": [
                    {
                        "resource_type": 2,
                        "resource_name": f"{KEEP}/partitions/0",
                        "configs": [{"name": "retention.ms", "value": "5"}],
                    }
                ]
            },
        )
        assert int(r.responses[0].error_code) == 3, r
    consistent(cluster)
