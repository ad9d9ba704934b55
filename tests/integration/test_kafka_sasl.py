"""The Kafka listener with API tokens configured (issue 14, item 4): SASL/PLAIN is required
(principal as user, its token as password), over TLS when the server has TLS; a PID
belongs to the principal that initialised it, and another principal's produce with it is
refused with Kafka's authorization error, writing nothing."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from partition_server.kafka import codec as C
from tests.kafka_wire import KafkaWire, produce_values, record_batch

TOKENS = "alice:producer:alice-token-123,bob:producer:bob-token-456,root:admin:root-token-789"


def sasl(user: str, token: str, **more: Any) -> dict[str, Any]:
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": user,
        "sasl.password": token,
        **more,
    }


def login(w: KafkaWire, user: str, token: str) -> int:
    hs = w.request(C.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
    assert int(hs.error_code) == 0 and list(hs.mechanisms) == ["PLAIN"]
    r = w.request(C.SASL_AUTHENTICATE, 2, {"auth_bytes": f"\0{user}\0{token}".encode()})
    return int(r.error_code)


def log_bytes(data_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(data_dir)): p.read_bytes() for p in sorted(data_dir.rglob("*.log"))}


def create(bootstrap: str, name: str, conf: dict[str, Any]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, **conf})
    assert admin.create_topics([NewTopic(name, 1, 1)])[name].result(30) is None


@pytest.fixture
def cluster(make_cluster):  # type: ignore[no-untyped-def]
    return make_cluster(servers=1, env={"PIDLEASE_API_TOKENS": TOKENS})


def test_sasl_plain_produce_consume_and_refusals(cluster) -> None:  # type: ignore[no-untyped-def]
    boot = cluster.kafka_bootstrap
    create(boot, "secure", sasl("root", "root-token-789"))
    p = Producer(
        {
            "bootstrap.servers": boot,
            "enable.idempotence": True,
            "acks": "all",
            **sasl("alice", "alice-token-123"),
        }
    )
    errs: list[Any] = []
    for i in range(200):
        p.produce("secure", b"m%d" % i, partition=0, on_delivery=lambda e, m: errs.append(e))
    assert p.flush(60) == 0 and errs == [None] * 200
    c = Consumer(
        {
            "bootstrap.servers": boot,
            "group.id": "g",
            "enable.auto.commit": False,
            **sasl("bob", "bob-token-456"),
        }
    )
    c.assign([TopicPartition("secure", 0, 0)])
    got = []
    deadline = time.monotonic() + 60
    while len(got) < 200 and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is not None and m.error() is None:
            got.append(m.value())
    c.close()
    assert got == [b"m%d" % i for i in range(200)]

    # A producer-scope principal may not create topics.
    admin = AdminClient({"bootstrap.servers": boot, **sasl("alice", "alice-token-123")})
    with pytest.raises(KafkaException) as info:
        admin.create_topics([NewTopic("nope", 1, 1)])["nope"].result(30)
    assert info.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    addr = cluster.servers[0].kafka_address
    with KafkaWire(addr) as w:  # no SASL: the first non-SASL request closes the connection
        w.send_raw(w.frame(C.METADATA, 1, {"topics": None}))
        assert w.closed_by_peer()
    with KafkaWire(addr) as w:  # a wrong token: SASL_AUTHENTICATION_FAILED, then closed
        assert login(w, "alice", "bob-token-456") == 58
        assert w.closed_by_peer()
    with KafkaWire(addr) as w:  # PLAIN only
        r = w.request(C.SASL_HANDSHAKE, 1, {"mechanism": "SCRAM-SHA-256"})
        assert int(r.error_code) == 33


def test_a_pid_belongs_to_its_principal(cluster) -> None:  # type: ignore[no-untyped-def]
    boot = cluster.kafka_bootstrap
    create(boot, "owned", sasl("root", "root-token-789"))
    addr = cluster.servers[0].kafka_address
    data = cluster.data_dir / "server-1" / "data"
    with KafkaWire(addr) as alice, KafkaWire(addr) as bob:
        assert login(alice, "alice", "alice-token-123") == 0
        assert login(bob, "bob", "bob-token-456") == 0
        init = alice.request(
            C.INIT_PRODUCER_ID,
            4,
            {
                "transaction_timeout": dt.timedelta(seconds=60),
                "producer_id": -1,
                "producer_epoch": -1,
            },
        )
        assert int(init.error_code) == 0 and init.producer_id > 0 and init.producer_epoch == 0
        pid = init.producer_id
        batch = record_batch([b"alice's"], pid=pid, epoch=0, base_sequence=0)
        before = log_bytes(data)
        r = bob.request(C.PRODUCE, 9, produce_values("owned", 0, batch))
        assert (
            int(r.responses[0].partition_responses[0].error_code) == 31
        )  # CLUSTER_AUTHORIZATION_FAILED
        assert log_bytes(data) == before, "a refused produce writes nothing"
        # Bob may not bump Alice's PID either.
        bump = bob.request(
            C.INIT_PRODUCER_ID,
            4,
            {
                "transaction_timeout": dt.timedelta(seconds=60),
                "producer_id": pid,
                "producer_epoch": 0,
            },
        )
        # Kafka's answer without a transactional id: a new PID, whatever was named.
        assert int(bump.error_code) == 0 and bump.producer_id not in (pid, -1)
        assert bump.producer_epoch == 0
        ok = alice.request(C.PRODUCE, 9, produce_values("owned", 0, batch))
        assert int(ok.responses[0].partition_responses[0].error_code) == 0
        # Alice's own InitProducerId naming her PID: a new PID too (as Kafka answers a
        # non-transactional producer); the old one is hers no more.
        mine = alice.request(
            C.INIT_PRODUCER_ID,
            4,
            {
                "transaction_timeout": dt.timedelta(seconds=60),
                "producer_id": pid,
                "producer_epoch": 0,
            },
        )
        assert int(mine.error_code) == 0 and mine.producer_epoch == 0
        assert mine.producer_id not in (pid, bump.producer_id)
        again = record_batch([b"alice's again"], pid=pid, epoch=0, base_sequence=1)
        old = alice.request(C.PRODUCE, 9, produce_values("owned", 0, again))
        assert int(old.responses[0].partition_responses[0].error_code) == 31


def test_sasl_over_tls(make_cluster) -> None:  # type: ignore[no-untyped-def]
    c = make_cluster(servers=1, tls=True, env={"PIDLEASE_API_TOKENS": TOKENS})
    conf = {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": c.ca_file,
        "sasl.mechanisms": "PLAIN",
    }
    create(
        c.kafka_bootstrap,
        "tls",
        {**conf, "sasl.username": "root", "sasl.password": "root-token-789"},
    )
    p = Producer(
        {
            "bootstrap.servers": c.kafka_bootstrap,
            "enable.idempotence": True,
            **conf,
            "sasl.username": "alice",
            "sasl.password": "alice-token-123",
        }
    )
    errs: list[Any] = []
    for i in range(50):
        p.produce("tls", b"t%d" % i, on_delivery=lambda e, m: errs.append(e))
    assert p.flush(60) == 0 and errs == [None] * 50
    # Plaintext on the TLS port gets nowhere.
    with KafkaWire(c.servers[0].kafka_address) as w:
        w.send_raw(w.frame(C.API_VERSIONS, 0, {}))
        assert w.closed_by_peer(20)


def test_sasl_handshake_v0_then_a_bare_token(cluster) -> None:  # type: ignore[no-untyped-def]
    """SaslHandshake v0: the next frame is the PLAIN token itself, answered by an empty
    frame on success and a closed connection otherwise (no SaslAuthenticate)."""
    addr = cluster.servers[0].kafka_address
    with KafkaWire(addr) as w:
        assert int(w.request(C.SASL_HANDSHAKE, 0, {"mechanism": "PLAIN"}).error_code) == 0
        token = b"\0alice\0alice-token-123"
        w.send_raw(len(token).to_bytes(4, "big") + token)
        assert w.read_frame() == b""
        md = w.request(C.METADATA, 1, {"topics": None})
        assert [b.node_id for b in md.brokers] == [1]
    with KafkaWire(addr) as w:
        assert int(w.request(C.SASL_HANDSHAKE, 0, {"mechanism": "PLAIN"}).error_code) == 0
        token = b"\0alice\0wrong-token"
        w.send_raw(len(token).to_bytes(4, "big") + token)
        assert w.closed_by_peer()
