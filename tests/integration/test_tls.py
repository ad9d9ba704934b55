"""TLS on both ports, on real processes (ZooKeeper, an HTTPS coordinator, TLS partition
servers; certificates made by ``openssl`` through ``LocalCluster(tls=True)``):

- a producer over TLS sends 20,000 records to a replicated partition while its leader is
  SIGKILLed once and restarted; every record is acknowledged, and the audit
  (``pidlease.cli.verify``) finds each acknowledged record exactly once;
- a plaintext client and garbage on a TLS port get a closed connection, the server logs one
  line for each and keeps serving;
- a client trusting another CA is refused with a certificate verification error, by the
  coordinator's HTTPS and by a partition server, and nothing is appended.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from pidlease import errors
from pidlease.cli.verify import verify_topic
from pidlease.client.connection import BlockingConnection, Connection
from pidlease.client.lease_client import LeaseClient
from pidlease.client.producer import Producer
from pidlease.client.reader import Reader
from pidlease.testing.devcluster import LocalCluster, http_json, make_certs
from pidlease.wire import protocol
from pidlease.wire.tls import TLS_CA_FILE_ENV, client_ssl_context
from tests.helpers import wait_for

TOPIC = "secure"
ENV = {
    "PIDLEASE_ZK_SESSION_TIMEOUT_MS": "4000",
    "PIDLEASE_REPLICA_LAG_TIME_MAX_MS": "3000",
    "PIDLEASE_HW_CHECKPOINT_INTERVAL_MS": "200",
}
N_RECORDS = 20_000


def partition_state(cluster: LocalCluster, partition: int = 0) -> dict[str, Any]:
    status, body = http_json(
        "GET", f"{cluster.coordinator_url}/v1/topics/{TOPIC}", ca_file=cluster.ca_file
    )
    assert status == 200, body
    return body["partition_states"][partition]


def read_all(cluster: LocalCluster, partition: int = 0) -> list[protocol.Record]:
    return list(
        Reader(
            cluster.coordinator_url,
            TOPIC,
            partition,
            tls_ca_file=cluster.ca_file,
            retry_timeout_ms=60_000,
        )
    )


@pytest.mark.slow
def test_tls_producer_survives_a_leader_sigkill_exactly_once(make_cluster, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = make_cluster(servers=3, tls=True, env=ENV)
    assert cluster.coordinator_url.startswith("https://")
    cluster.create_topic(TOPIC, partitions=1, replication_factor=3)
    futures: list[Any] = []
    failure: list[BaseException] = []
    pid = [-1]

    def produce() -> None:
        try:
            with Producer(
                cluster.coordinator_url,
                topic=TOPIC,
                producer_name="tls-job",
                tls_ca_file=cluster.ca_file,
                max_in_flight=5,
                batch_records_max=250,
                request_timeout_ms=5_000,
            ) as p:
                pid[0] = p.pid
                t0 = time.monotonic()
                for i in range(N_RECORDS):
                    futures.append(p.send(b"tls-%d" % i, partition=0))
                    if i % 500 == 499:  # ~4000/s, so the kill lands mid-run
                        time.sleep(max(0.0, t0 + (i + 1) / 4000 - time.monotonic()))
                p.flush()
        except BaseException as exc:  # noqa: BLE001 - reported below
            failure.append(exc)

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    wait_for(
        lambda: sum(f.done() for f in futures[:]) >= 5_000 or not t.is_alive(),
        90,
        "5,000 records acked over TLS",
    )
    leader = cluster.server(partition_state(cluster)["leader"])
    cluster.kill(leader)  # SIGKILL
    wait_for(lambda: partition_state(cluster)["leader"] != leader.ident, 60, "a new leader")
    cluster.start_service(leader)
    t.join(180)
    assert not t.is_alive(), "the producer did not finish"
    assert not failure, failure
    assert len(futures) == N_RECORDS
    metas = [f.result(timeout=0) for f in futures]  # raises if any record failed
    acked = [(m.partition, pid[0], m.sequence_id) for m in metas]

    # The audit of pidlease.cli.verify, over TLS (its readers take the CA from the environment).
    monkeypatch.setenv(TLS_CA_FILE_ENV, str(cluster.ca_file))
    report = verify_topic(cluster.coordinator_url, TOPIC, acked=acked)
    print(
        f"TLS leader kill: {report.summary()}; duplicates acked {sum(m.duplicate for m in metas)}"
    )
    assert report.ok, report.summary()
    assert report.total("records") == N_RECORDS
    assert report.total("acked_missing") == 0
    by_offset = {r.offset: (r.pid, r.sequence_id) for r in read_all(cluster) if not r.is_control}
    for m in metas:
        if not m.duplicate:  # acknowledged where it is
            assert by_offset[m.offset] == (pid[0], m.sequence_id)
    # The restarted server is a TLS follower again: it caught up over TLS.
    wait_for(
        lambda: leader.ident in partition_state(cluster)["isr"],
        60,
        "the restarted server back in the in-sync set",
    )


def _handshake_lines(path: Any) -> list[str]:
    return [
        ln for ln in path.read_text(errors="replace").splitlines() if "TLS handshake with" in ln
    ]


def test_plaintext_garbage_and_wrong_ca_are_refused_cleanly(make_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cluster: LocalCluster = make_cluster(servers=1, tls=True)
    cluster.create_topic(TOPIC, partitions=1)
    svc = cluster.server(1)
    with Producer(cluster.coordinator_url, topic=TOPIC, tls_ca_file=cluster.ca_file) as p:
        p.send(b"before").result(timeout=30)
    assert len(read_all(cluster)) == 1
    before = len(_handshake_lines(svc.log_path))

    # 1. A plaintext client on the TLS port: a clean connection error, not a hang.
    with (
        BlockingConnection(svc.address, timeout_ms=15_000) as plain,
        pytest.raises(errors.ServerUnavailable, match=r"closed the connection|failed"),
    ):
        plain.request(protocol.METADATA, protocol.metadata_request)
    # 2. Garbage: a frame-shaped request and random bytes where a ClientHello belongs.
    for junk in (protocol.metadata_request(1), bytes(range(256)) * 4):
        with socket.create_connection(("127.0.0.1", svc.port), timeout=15) as s:
            s.sendall(junk)
            with contextlib.suppress(ConnectionResetError):  # closed by the server, or reset
                assert s.recv(100) == b""
    wait_for(
        lambda: len(_handshake_lines(svc.log_path)) >= before + 3,
        15,
        "one log line per refused connection",
    )
    lines = _handshake_lines(svc.log_path)[before:]
    assert len(lines) == 3, lines
    assert all("closing the connection" in ln for ln in lines), lines
    assert "Traceback" not in svc.log_path.read_text(errors="replace")

    # 3. Clients that trust another CA.
    other = make_certs(tmp_path / "other-ca")
    wrong = str(other["ca"])
    with pytest.raises(errors.Unauthorized, match="certificate verif"):
        Producer(cluster.coordinator_url, topic=TOPIC, tls_ca_file=wrong, start_timeout_ms=5_000)
    with pytest.raises(errors.Unauthorized, match="certificate verif"):
        list(Reader(cluster.coordinator_url, TOPIC, 0, tls_ca_file=wrong))
    with (
        pytest.raises(errors.Unauthorized, match="certificate verif"),
        LeaseClient(cluster.coordinator_url, tls_ca_file=wrong) as lc,
    ):
        lc.topic(TOPIC)
    # ... straight to the partition server, both client kinds:
    with pytest.raises(errors.Unauthorized, match="certificate verif"):
        BlockingConnection(svc.address, ssl_context=client_ssl_context(wrong))

    async def open_async() -> None:
        await Connection.open(svc.address, ssl_context=client_ssl_context(wrong))

    with pytest.raises(errors.Unauthorized, match="certificate verif"):
        asyncio.run(open_async())
    # ... and an http:// URL for the https coordinator is a connection error, not a hang.
    with (
        pytest.raises(errors.CoordinatorUnavailable),
        LeaseClient(
            cluster.coordinator_url.replace("https:", "http:"), request_timeout_ms=5_000
        ) as lc,
    ):
        lc.topic(TOPIC)

    # Nothing was appended by any of them, and the server still serves TLS clients.
    assert svc.alive
    assert [r.value for r in read_all(cluster)] == [b"before"]
    with Producer(cluster.coordinator_url, topic=TOPIC, tls_ca_file=cluster.ca_file) as p:
        md = p.send(b"after").result(timeout=30)
    assert md.offset == 1
    assert [r.value for r in read_all(cluster)] == [b"before", b"after"]

    # A takeover: the HTTPS coordinator FENCEs the PID through the TLS partition server.
    with Producer(
        cluster.coordinator_url, topic=TOPIC, producer_name="job", tls_ca_file=cluster.ca_file
    ) as old:
        old.send(b"old").result(timeout=30)
        with Producer(
            cluster.coordinator_url, topic=TOPIC, producer_name="job", tls_ca_file=cluster.ca_file
        ) as new:
            assert new.pid == old.pid and new.generation == old.generation + 1
            new.send(b"new").result(timeout=30)
        with pytest.raises(errors.ProducerFenced):
            old.send(b"zombie").result(timeout=30)
    values = [r.value for r in read_all(cluster)]
    assert values == [b"before", b"after", b"old", b"new"], values

    # The CLI over TLS: --tls-ca-file on consume and verify; without it, a clear refusal.
    env = {k: v for k, v in os.environ.items() if k != TLS_CA_FILE_ENV}
    base = [sys.executable, "-m", "pidlease.cli"]
    coord = ["--coordinator", cluster.coordinator_url]
    out = subprocess.run(
        [*base, "consume", TOPIC, *coord, "--tls-ca-file", str(cluster.ca_file)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert out.returncode == 0 and out.stdout.split("\n")[3].endswith("new"), out
    out = subprocess.run(
        [*base, "verify", TOPIC, *coord, "--tls-ca-file", str(cluster.ca_file)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert out.returncode == 0, out
    out = subprocess.run(
        [*base, "verify", TOPIC, *coord, "--tls-ca-file", wrong],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert out.returncode == 1 and "certificate verification" in out.stderr, out


def test_tls_settings_are_checked_at_start(make_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """One file without the other, or a missing file: the server refuses to start, saying why."""
    cluster: LocalCluster = make_cluster(servers=0, coordinators=0)
    svc = cluster.add_server(
        1, start=False, extra_env={"PIDLEASE_TLS_CERTFILE": str(tmp_path / "x.pem")}
    )
    with pytest.raises(RuntimeError, match="exited with 2"):
        cluster.start_service(svc, timeout_s=30)
    assert "both tls_certfile and tls_keyfile" in svc.log_path.read_text()
    svc.extra_env["PIDLEASE_TLS_KEYFILE"] = str(tmp_path / "x.key")
    with pytest.raises(RuntimeError, match="exited with 2"):
        cluster.start_service(svc, timeout_s=30)
    assert "cannot load the TLS certificate" in svc.log_path.read_text()
