"""docker-compose.yml validated by Debian's ``docker-compose`` (1.29, no engine needed), and
checked for what the deployment promises: a 3-node ZooKeeper ensemble, 2 coordinators,
3 partition servers with a replication-factor-3 topic, a Spark master and worker, images
from this repository's Dockerfile, health checks everywhere, ports only on loopback, and
no PIDLEASE_* variable that the services would silently ignore. Skipped only when the
``docker-compose`` binary is absent."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from coordinator.settings import CoordinatorSettings
from partition_server.settings import ServerSettings

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = shutil.which("docker-compose")
pytestmark = pytest.mark.skipif(COMPOSE is None, reason="Debian's docker-compose is not installed")

ONE_SHOT = {"topics"}
CLI_ENV = {"PIDLEASE_COORDINATOR", "PIDLEASE_ZK"}


def compose(
    *args: str, file: Path = ROOT / "docker-compose.yml"
) -> subprocess.CompletedProcess[str]:
    assert COMPOSE is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIDLEASE_", "COMPOSE_"))}
    return subprocess.run(
        [COMPOSE, "-f", str(file), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=file.parent,
        check=False,
    )


def services() -> dict[str, str]:
    """Service name -> its block of the normalized ``config`` output (fixed layout:
    services at two spaces, their keys at four)."""
    out = compose("config")
    assert out.returncode == 0, out.stderr
    text = (
        out.stdout.split("\nservices:\n", 1)[1]
        if not out.stdout.startswith("services:")
        else out.stdout.split("services:\n", 1)[1]
    )
    text = re.split(r"^\S", text, maxsplit=1, flags=re.MULTILINE)[0]  # up to the next top-level key
    blocks = re.split(r"^  (\S+):\n", text, flags=re.MULTILINE)[1:]
    return dict(zip(blocks[::2], blocks[1::2], strict=True))


def env_names(block: str) -> set[str]:
    return set(re.findall(r"^      (PIDLEASE_[A-Z0-9_]+):", block, flags=re.MULTILINE))


def setting_names(settings: type) -> set[str]:
    return {"PIDLEASE_" + name.upper() for name in settings.model_fields}  # type: ignore[attr-defined]


def test_the_file_validates() -> None:
    out = compose("config", "-q")
    assert out.returncode == 0, out.stderr


def test_the_validator_is_real(tmp_path: Path) -> None:
    bad = tmp_path / "docker-compose.yml"
    bad.write_text("services:\n  a:\n    image: busybox\n    helthcheck: {test: [CMD, 'true']}\n")
    assert compose("config", "-q", file=bad).returncode != 0


def test_the_services_the_issue_asks_for() -> None:
    got = services()
    assert set(got) == {
        "zk1",
        "zk2",
        "zk3",
        "server1",
        "server2",
        "server3",
        "coordinator1",
        "coordinator2",
        "topics",
        "spark-master",
        "spark-worker",
    }
    for zk in ("zk1", "zk2", "zk3"):
        assert re.search(
            r"ZOO_SERVERS: server\.1=zk1:2888:3888;2181 server\.2=zk2:2888:3888;2181 "
            r"server\.3=zk3:2888:3888;2181",
            got[zk],
        ), zk
        assert f"ZOO_MY_ID: '{zk[-1]}'" in got[zk]
    assert "--replication-factor 3" in got["topics"]
    assert "spark://spark-master:7077" in got["spark-worker"]
    assert "org.apache.spark.deploy.master.Master" in got["spark-master"]


def test_images_come_from_this_dockerfile_and_every_daemon_has_a_health_check() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    targets = set(re.findall(r"^FROM \S+ AS (\S+)$", dockerfile, flags=re.MULTILINE))
    for src in re.findall(r"^COPY (\S+) \./", dockerfile, flags=re.MULTILINE):
        assert (ROOT / src).exists(), f"Dockerfile copies missing {src}"
    for name, block in services().items():
        if not name.startswith("zk"):
            m = re.search(
                r"^    build:\n      context: (\S+)\n      target: (\S+)$",
                block,
                flags=re.MULTILINE,
            )
            assert m, f"{name} is not built from the Dockerfile"
            assert Path(m.group(1)).resolve() == ROOT and m.group(2) in targets, name
        if name not in ONE_SHOT:
            assert re.search(
                r"^    healthcheck:\n(      .*\n)*      test:", block, flags=re.MULTILINE
            ), name


def test_ports_are_published_on_loopback_only() -> None:
    published = []
    for name, block in services().items():
        m = re.search(r"^    ports:\n((?:    - .*\n)+)", block, flags=re.MULTILINE)
        if m:
            published += [(name, line.strip()[2:]) for line in m.group(1).splitlines()]
    assert {n for n, _ in published} == {"coordinator1", "coordinator2", "spark-master"}
    assert all(p.startswith("127.0.0.1:") for _, p in published), published


def test_no_pidlease_variable_is_silently_ignored() -> None:
    server_vars = setting_names(ServerSettings)
    coordinator_vars = setting_names(CoordinatorSettings)
    for name, block in services().items():
        used = env_names(block)
        if name.startswith("server"):
            assert used <= server_vars, (name, used - server_vars)
            assert {"PIDLEASE_SERVER_ID", "PIDLEASE_METRICS_PORT"} <= used
        elif name.startswith("coordinator"):
            assert used <= coordinator_vars, (name, used - coordinator_vars)
        else:
            assert used <= CLI_ENV, (name, used - CLI_ENV)
