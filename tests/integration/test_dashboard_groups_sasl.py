"""Consumer groups on the dashboard when the Kafka listeners require SASL (issue 25, item 3
of session 24): with API tokens configured, the coordinator's groups view logs in to every
partition server's listener as its own admin principal, so a group committed by a SASL
client shows with its lag and no server is reported as not answering. Before, the view
connected without SASL, every listener closed the connection, and the dashboard had no
groups (``groups_unknown`` named every server). Over TLS too (SASL_SSL): the coordinator
calls the listeners over TLS as it calls the servers."""

from __future__ import annotations

import json
import ssl
import urllib.request
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.helpers import wait_for
from tests.integration.test_kafka_sasl import TOKENS
from tests.integration.test_kafka_sasl import sasl as sasl_plain

GROUP = "audited"


def dashboard(c: Any) -> dict[str, Any]:
    req = urllib.request.Request(
        f"{c.coordinator_url}/dashboard/data",
        headers={"Authorization": "Bearer root-token-789"},
    )
    ctx = ssl.create_default_context(cafile=str(c.ca_file)) if c.ca_file else None
    with urllib.request.urlopen(req, timeout=30, context=ctx) as r:
        body: dict[str, Any] = json.loads(r.read())
    return body


@pytest.mark.parametrize("tls", [False, True], ids=["sasl_plaintext", "sasl_ssl"])
def test_groups_of_sasl_listeners_on_the_dashboard(make_cluster: Any, tls: bool) -> None:
    c = make_cluster(servers=2, tls=tls, env={"PIDLEASE_API_TOKENS": TOKENS})

    def sasl(user: str, token: str) -> dict[str, Any]:
        conf = sasl_plain(user, token)
        if tls:
            conf.update({"security.protocol": "SASL_SSL", "ssl.ca.location": str(c.ca_file)})
        return conf

    admin = AdminClient({"bootstrap.servers": c.kafka_bootstrap, **sasl("root", "root-token-789")})
    assert admin.create_topics([NewTopic("ledger", 2, 2)])["ledger"].result(30) is None
    k = Consumer(
        {
            "bootstrap.servers": c.kafka_bootstrap,
            "group.id": GROUP,
            "enable.auto.commit": False,
            **sasl("bob", "bob-token-456"),
        }
    )
    try:
        done = k.commit(
            offsets=[TopicPartition("ledger", 0, 0), TopicPartition("ledger", 1, 0)],
            asynchronous=False,
        )
        assert done is not None and all(t.error is None for t in done), done
    finally:
        k.close()

    def rows() -> list[dict[str, Any]] | None:
        body = dashboard(c)
        got = [r for r in body["groups"] if r["group"] == GROUP]
        return got if len(got) == 2 else None

    got = wait_for(rows, 60, "the SASL group on the dashboard")
    assert sorted((r["partition"], r["committed"], r["lag"]) for r in got) == [(0, 0, 0), (1, 0, 0)]
    assert dashboard(c)["groups_unknown"] == [], "a server's groups not seen"
