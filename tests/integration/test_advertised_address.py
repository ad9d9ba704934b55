"""``advertised_host``/``advertised_port``: a partition server listens on P and registers a
FaultProxy's port Q, so every client (producers, readers, the coordinator) reaches it
through the proxy. The proxy cuts and blackholes the produce path several times while a
producer pipelines; once it heals the producer completes, and every acknowledged record
is in the log exactly once (``pidlease.cli.verify``)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from pidlease.cli.verify import verify_topic
from pidlease.client.producer import Producer
from pidlease.testing.devcluster import LocalCluster, http_json
from pidlease.testing.faultproxy import FaultProxy
from pidlease.testing.zkserver import free_port

TOPIC = "proxied"
N_RECORDS = 20_000


@pytest.mark.slow
def test_produce_through_a_faulty_advertised_proxy_exactly_once(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = make_cluster(servers=0)
    listen_port = free_port()
    proxy = FaultProxy(f"127.0.0.1:{listen_port}").start()
    try:
        cluster.add_server(1, listen_port, extra_env={"PIDLEASE_ADVERTISED_PORT": str(proxy.port)})
        cluster.create_topic(TOPIC, partitions=2)
        status, body = http_json("GET", f"{cluster.coordinator_url}/v1/topics/{TOPIC}")
        assert status == 200, body
        assert {p["leader_address"] for p in body["partition_states"]} == {proxy.address}

        futures: list[Any] = []
        failure: list[BaseException] = []
        pid = [-1]
        stats: dict[str, int] = {}

        def produce() -> None:
            try:
                with Producer(
                    cluster.coordinator_url,
                    topic=TOPIC,
                    producer_name="proxied",
                    max_in_flight=5,
                    batch_records_max=200,
                    request_timeout_ms=2_000,
                    retry_backoff_max_ms=500,
                ) as p:
                    pid[0] = p.pid
                    t0 = time.monotonic()
                    for i in range(N_RECORDS):
                        futures.append(p.send(b"r-%d" % i))
                        if i % 500 == 499:  # ~2500/s: the faults land mid-run
                            time.sleep(max(0.0, t0 + (i + 1) / 2500 - time.monotonic()))
                    p.flush()
                    stats.update(p.stats)
            except BaseException as exc:  # noqa: BLE001 - reported below
                failure.append(exc)

        t = threading.Thread(target=produce, daemon=True)
        t.start()
        faults = []
        for round_ in range(6):
            time.sleep(0.8)
            if round_ % 2 == 0:
                faults.append(f"cut {proxy.drop_all()}")
            else:
                proxy.blackhole(1.5)
                faults.append("blackhole 1.5s")
        proxy.heal()
        t.join(180)
        assert not t.is_alive(), "the producer did not complete after the proxy healed"
        assert not failure, failure
        metas = [f.result(timeout=0) for f in futures]  # raises if any record failed
        assert len(metas) == N_RECORDS
        report = verify_topic(
            cluster.coordinator_url,
            TOPIC,
            acked=[(m.partition, pid[0], m.sequence_id) for m in metas],
        )
        print(
            f"ADVERTISED proxy faults {faults}: {report.summary()}; producer stats {stats}; "
            f"proxy connections accepted {proxy.connections_accepted}, dropped "
            f"{proxy.connections_dropped}"
        )
        assert report.ok, report.summary()
        assert report.total("records") == N_RECORDS
        assert proxy.connections_dropped >= 3  # the faults did cut live connections
    finally:
        proxy.close()
