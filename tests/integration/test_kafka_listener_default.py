"""The Kafka listener (and its group coordinator) is on by default (issue 26): a bare
partition server listens on 9092; a port in use stops the start with one clear line
naming the setting, instead of a server without the group coordinator processors need."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from partition_server.settings import ServerSettings
from pidlease.testing.zkserver import free_port


def test_the_default_is_kafkas_port(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("PIDLEASE_KAFKA_PORT", raising=False)
    assert ServerSettings(data_dir="/tmp/unused").kafka_port == 9092


def test_a_kafka_port_in_use_is_one_clear_line(zk_hosts: str, tmp_path: Path) -> None:
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIDLEASE_")}
    env.update(
        PIDLEASE_ZK=zk_hosts,
        PIDLEASE_PORT=str(free_port()),
        PIDLEASE_KAFKA_PORT=str(port),
        PIDLEASE_SERVER_ID="41",
        PIDLEASE_DATA_DIR=str(tmp_path / "data"),
    )
    try:
        p = subprocess.run(
            [sys.executable, "-m", "partition_server"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        held.close()
    assert p.returncode == 1, p.stderr[-3000:]
    assert f"cannot bind 127.0.0.1:{port}" in p.stderr, p.stderr[-3000:]
    assert "PIDLEASE_KAFKA_PORT" in p.stderr and "Traceback" not in p.stderr, p.stderr[-3000:]
