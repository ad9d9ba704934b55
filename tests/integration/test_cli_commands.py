"""The `pidlease` command end to end, run as a real subprocess against a real cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from pidlease.cli.devctl import STATE_FILE
from pidlease.testing.zkserver import free_port
from tests.helpers import cli


def test_topics_produce_consume_pids_verify(make_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    c = make_cluster(servers=2)
    url = c.coordinator_url

    r = cli(
        "topic",
        "create",
        "orders",
        "--partitions",
        "2",
        "--replication-factor",
        "1",
        "--dedup",
        "strict",
        url=url,
    )
    assert r.returncode == 0, r.stderr
    assert "created topic orders" in r.stdout and "PARTITION" in r.stdout
    again = cli("topic", "create", "orders", "--partitions", "2", url=url)
    assert again.returncode == 1 and "TOPIC_EXISTS" in again.stderr
    bad = cli("topic", "create", "x", "--dedup", "sometimes", url=url)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr

    listed = cli("topic", "list", "--json", url=url)
    assert [t["name"] for t in json.loads(listed.stdout)] == ["orders"]
    assert "orders" in cli("topic", "list", url=url).stdout
    described = json.loads(cli("topic", "describe", "orders", "--json", url=url).stdout)
    assert described["partitions"] == 2 and len(described["partition_states"]) == 2
    missing = cli("topic", "describe", "nope", url=url)
    assert missing.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in missing.stderr
    assert "pidlease topic list" in missing.stderr  # says what to do

    lines = "".join(f"cust-{i % 5}:order {i}\n" for i in range(200))
    r = cli(
        "produce",
        "orders",
        "--key-separator",
        ":",
        "--producer-name",
        "loader",
        url=url,
        stdin=lines,
    )
    assert r.returncode == 0, r.stderr
    assert "200 new, 0 duplicates, 0 failed" in r.stdout
    nosep = cli(
        "produce", "orders", "--key-separator", ":", url=url, stdin="ok:1\nno separator here\n"
    )
    assert nosep.returncode == 1 and "line 2 has no key separator" in nosep.stderr

    consumed = []
    for part in range(2):
        r = cli("consume", "orders", "--partition", str(part), "--from", "0", "--json", url=url)
        assert r.returncode == 0, r.stderr
        consumed += [json.loads(x) for x in r.stdout.splitlines()]
    assert len(consumed) == 201
    assert sorted(x["value"] for x in consumed if x["key"].startswith("cust-")) == sorted(
        f"order {i}" for i in range(200)
    )
    assert {x["key"] for x in consumed if x["value"] == "order 7"} == {"cust-2"}
    few = cli("consume", "orders", "--partition", "0", "--from", "3", "--max", "2", url=url)
    offsets = [int(line.split("\t")[0]) for line in few.stdout.splitlines()]
    assert offsets == [3, 4]

    pids = json.loads(cli("pids", "--json", url=url).stdout)
    loader = [x for x in pids if x.get("producer_name") == "loader"]
    assert len(loader) == 1 and loader[0]["state"] in ("active", "expiring")
    table = cli("pids", url=url)
    assert table.returncode == 0 and "EXPIRES_IN" in table.stdout and "loader" in table.stdout
    soon = json.loads(cli("pids", "--json", "--expiring-within", "1ms", url=url).stdout)
    assert all(x["expires_in_ms"] <= 1 for x in soon)
    assert cli("pids", "--expiring-within", "soon", url=url).returncode == 2

    ok = cli("verify", "orders", url=url)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "EXACTLY-ONCE: OK" in ok.stdout
    acked = tmp_path / "acked.jsonl"
    acked.write_text(
        json.dumps({"partition": 0, "pid": loader[0]["pid"], "sequence_id": 10**6}) + "\n"
    )
    bad_verify = cli("verify", "orders", "--acked", str(acked), url=url)
    assert bad_verify.returncode == 1
    assert (
        "EXACTLY-ONCE: VIOLATED" in bad_verify.stdout and "is not in the log" in bad_verify.stdout
    )

    # a rerun under the same producer name takes the PID over: same pid, new generation
    r2 = cli(
        "produce",
        "orders",
        "--producer-name",
        "loader",
        "--partition",
        "1",
        url=url,
        stdin="late\n",
    )
    assert r2.returncode == 0 and f"as pid {loader[0]['pid']} generation" in r2.stdout
    assert f"generation {loader[0]['generation']} " not in r2.stdout


def test_unreachable_coordinator_says_what_to_do() -> None:
    port = free_port()
    r = cli("topic", "list", "--coordinator", f"http://127.0.0.1:{port}")
    assert r.returncode == 1
    assert "COORDINATOR_UNAVAILABLE" in r.stderr and "pidlease dev up" in r.stderr


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[-1].split()[0] != "Z"


@pytest.mark.slow
def test_dev_up_detach_and_down(tmp_path: Path) -> None:
    data = tmp_path / "dev"
    port = free_port()
    up = cli(
        "dev",
        "up",
        "--servers",
        "2",
        "--replication-factor",
        "2",
        "--detach",
        "--data-dir",
        str(data),
        "--port",
        str(port),
    )
    assert up.returncode == 0, up.stdout + up.stderr
    url = f"http://127.0.0.1:{port}"
    try:
        assert f"coordinator: {url}" in up.stdout
        state = json.loads((data / STATE_FILE).read_text())
        pids = [p["pid"] for p in state["processes"]]
        assert len(pids) == 4 and all(_alive(p) for p in pids)  # zk, coordinator, 2 servers
        again = cli("dev", "up", "--detach", "--data-dir", str(data), "--port", str(port))
        assert again.returncode == 1 and "already running" in again.stderr
        # `dev up --replication-factor 2` is the cluster's default for new topics (issue 29:
        # before, `topic create` made R=1 unless told again).
        made = cli("topic", "create", "t", "--partitions", "2", url=url)
        assert made.returncode == 0, made.stderr
        assert "replication factor 2," in made.stdout, made.stdout
        one = cli("topic", "create", "t1", "--replication-factor", "1", url=url)
        assert "replication factor 1," in one.stdout, one.stdout + one.stderr
        r = cli("produce", "t", url=url, stdin="a\nb\nc\n")
        assert r.returncode == 0 and "3 new" in r.stdout
        # The Kafka listeners are on, and printed (CONTRACT.md, "Kafka protocol").
        line = next(x for x in up.stdout.splitlines() if x.startswith("kafka bootstrap: "))
        boot = line.removeprefix("kafka bootstrap: ")
        assert len(boot.split(",")) == 2 and state["kafka_bootstrap"] == boot
        from confluent_kafka.admin import AdminClient

        md = AdminClient({"bootstrap.servers": boot}).list_topics("t", timeout=30)
        assert len(md.topics["t"].partitions) == 2 and len(md.brokers) == 2
    finally:
        down = cli("dev", "down", "--data-dir", str(data))
    assert down.returncode == 0, down.stdout + down.stderr
    assert not any(_alive(p) for p in pids)
    assert not (data / STATE_FILE).exists()
    gone = cli("dev", "down", "--data-dir", str(data))
    assert gone.returncode == 1 and "is one running" in gone.stderr


@pytest.mark.slow
def test_dev_up_foreground_stops_on_dev_down(tmp_path: Path) -> None:
    data = tmp_path / "fg"
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pidlease.cli",
            "dev",
            "up",
            "--data-dir",
            str(data),
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        seen = []
        deadline = time.monotonic() + 120
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("running;") or time.monotonic() > deadline:
                break
        assert any(f"coordinator: http://127.0.0.1:{port}" in x for x in seen), "".join(seen)
        state = json.loads((data / STATE_FILE).read_text())
        down = cli("dev", "down", "--data-dir", str(data))
        assert down.returncode == 0, down.stdout + down.stderr
        assert proc.wait(60) == 0
        rest = proc.stdout.read()
        assert "stopped" in rest
        assert not any(_alive(p["pid"]) for p in state["processes"])
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        if proc.stdout is not None:
            proc.stdout.close()


def _wait_listening(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited with {proc.returncode}"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listening on {port}")


def test_service_commands_run_the_services(zk_hosts: str, tmp_path: Path) -> None:
    sport, cport, kport = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIDLEASE_")}
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pidlease.cli",
            "partition-server",
            "--zk",
            zk_hosts,
            "--port",
            str(sport),
            "--kafka-port",
            str(kport),
            "--server-id",
            "7",
            "--data-dir",
            str(tmp_path / "s7"),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    coord = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pidlease.cli",
            "coordinator",
            "--zk",
            zk_hosts,
            "--port",
            str(cport),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_listening(sport, server)
        _wait_listening(cport, coord)
        url = f"http://127.0.0.1:{cport}"
        deadline = time.monotonic() + 30
        while True:  # the server registers itself in ZooKeeper shortly after listening
            r = cli("topic", "create", "svc", "--partitions", "1", url=url)
            if r.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "s7").exists()
        p = cli("produce", "svc", url=url, stdin="x\ny\n")
        assert p.returncode == 0 and "2 new" in p.stdout, p.stderr
        # the Kafka listener (with its group coordinator) is on and in the registry
        _wait_listening(kport, server)
        servers = httpx.get(f"{url}/v1/servers", timeout=10).json()["servers"]
        assert [s.get("kafka_port") for s in servers] == [kport], servers
    finally:
        for proc in (coord, server):
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    # uvicorn re-raises the SIGTERM it handled once it has shut down cleanly
    assert coord.returncode in (0, -signal.SIGTERM) and server.returncode == 0
