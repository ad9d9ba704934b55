"""A pidlease cluster on hosts made of network namespaces (``pidlease.testing.netns``):
one ZooKeeper host, one host per partition server and one for the coordinator and the
clients, joined by a bridge in a namespace of its own.

Every process is started as an operator would (``python -m partition_server`` with
``PIDLEASE_*`` settings, ZooKeeper's ``QuorumPeerMain``) inside its host, listening on and
advertising that host's address, so producers, followers, the coordinator and ZooKeeper
all talk over links a nemesis can cut. The caller's thread must be in the client host
(``net.entered("client")``) to reach them: the test process is a client like any other.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from pidlease.testing.devcluster import DEV_SECRET, http_json, tail
from pidlease.testing.netns import Network
from pidlease.testing.zkserver import MAIN_CLASS, SLF4J_JAR, ZK_JAR, check_installed
from pidlease.wire.cluster import PartitionState, partition_path

ZK_PORT = 2181
SERVER_PORT = 8480
METRICS_PORT = 9480
COORDINATOR_PORT = 8080
CHROOT = "/pidlease"
CLIENT = "client"


def hosts_for(servers: int) -> list[str]:
    return ["zk", *(f"s{i}" for i in range(1, servers + 1)), CLIENT]


@dataclass
class Proc:
    name: str  # "zk", "s1", "coordinator"
    host: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    port: int
    proc: Any = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class NetCluster:
    """ZooKeeper + ``servers`` partition servers + one coordinator, each in its host."""

    net: Network
    data_dir: Path
    servers: int = 3
    server_env: dict[str, str] = field(default_factory=dict)
    procs: dict[str, Proc] = field(default_factory=dict)
    _zk: KazooClient | None = None

    def address(self, host: str) -> str:
        return self.net.hosts[host].address

    @property
    def zk_hosts(self) -> str:
        return f"{self.address('zk')}:{ZK_PORT}"

    @property
    def coordinator_url(self) -> str:
        return f"http://{self.address(CLIENT)}:{COORDINATOR_PORT}"

    def server_ids(self) -> list[int]:
        return list(range(1, self.servers + 1))

    def metrics_url(self, server_id: int) -> str:
        return f"http://{self.address(f's{server_id}')}:{METRICS_PORT}/metrics"

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, timeout_s: float = 90.0) -> NetCluster:
        check_installed()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._zookeeper(timeout_s)
        for i in self.server_ids():
            self._server(i)
        for i in self.server_ids():
            self.start_proc(self.procs[f"s{i}"], timeout_s)
        self._coordinator()
        self.start_proc(self.procs["coordinator"], timeout_s)
        self._wait_healthy(timeout_s)
        return self

    def _env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            PIDLEASE_ZK=self.zk_hosts + CHROOT,
            PIDLEASE_LEASE_SECRET=DEV_SECRET,
            PYTHONUNBUFFERED="1",
        )
        env.update(extra)
        return env

    def _zookeeper(self, timeout_s: float) -> None:
        zdir = self.data_dir / "zookeeper"
        zdir.mkdir(parents=True, exist_ok=True)
        cfg = zdir / "zoo.cfg"
        cfg.write_text(
            "\n".join(
                [
                    # As pidlease.testing.zkserver: a short tick so sessions as short as
                    # the partition servers ask (docs/replication.md) are granted as asked.
                    "tickTime=250",
                    "minSessionTimeout=500",
                    "maxSessionTimeout=40000",
                    f"dataDir={zdir}",
                    f"clientPort={ZK_PORT}",
                    f"clientPortAddress={self.address('zk')}",
                    "admin.enableServer=false",
                    "4lw.commands.whitelist=*",
                    "maxClientCnxns=0",
                ]
            )
            + "\n"
        )
        argv = ["java", "-Xmx256m", "-cp", f"{zdir}:{ZK_JAR}:{SLF4J_JAR}", MAIN_CLASS, str(cfg)]
        p = Proc("zk", "zk", argv, dict(os.environ), zdir / "zookeeper.log", ZK_PORT)
        self.procs["zk"] = p
        self.start_proc(p, timeout_s)

    def _server(self, i: int) -> None:
        host = f"s{i}"
        sdir = self.data_dir / f"server-{i}"
        sdir.mkdir(parents=True, exist_ok=True)
        env = self._env(
            PIDLEASE_SERVER_ID=str(i),
            PIDLEASE_HOST=self.address(host),
            PIDLEASE_ADVERTISED_HOST=self.address(host),
            PIDLEASE_PORT=str(SERVER_PORT),
            PIDLEASE_METRICS_PORT=str(METRICS_PORT),
            PIDLEASE_DATA_DIR=str(sdir / "data"),
        )
        env.update(self.server_env)
        argv = [sys.executable, "-m", "partition_server"]
        self.procs[host] = Proc(host, host, argv, env, sdir / "server.log", SERVER_PORT)

    def _coordinator(self) -> None:
        cdir = self.data_dir / "coordinator"
        cdir.mkdir(parents=True, exist_ok=True)
        env = self._env(
            PIDLEASE_HTTP_HOST=self.address(CLIENT),
            PIDLEASE_HTTP_PORT=str(COORDINATOR_PORT),
            PIDLEASE_COORDINATOR_ID="coordinator-1",
        )
        argv = [sys.executable, "-m", "coordinator"]
        self.procs["coordinator"] = Proc(
            "coordinator", CLIENT, argv, env, cdir / "coordinator.log", COORDINATOR_PORT
        )

    def add_server(self, i: int, timeout_s: float = 90.0) -> None:
        """Start partition server ``i`` (its host must exist: ``hosts_for(n)`` with n >= i),
        a server joining the running cluster (the moves scenario's new server)."""
        self._server(i)
        self.start_proc(self.procs[f"s{i}"], timeout_s)
        self.servers = max(self.servers, i)

    def start_proc(self, p: Proc, timeout_s: float = 90.0) -> None:
        with open(p.log_path, "ab") as log:
            log.write(f"\n=== start {p.name} at {time.strftime('%H:%M:%S')} ===\n".encode())
            log.flush()
            p.proc = self.net.popen(p.host, p.argv, env=p.env, log=log)
        addr = self.address(p.host)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if p.proc.poll() is not None:
                raise RuntimeError(f"{p.name} exited {p.proc.returncode}:\n{tail(p.log_path)}")
            try:
                with socket.create_connection((addr, p.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"{p.name} not listening on {addr}:{p.port}:\n{tail(p.log_path)}")

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if http_json("GET", self.coordinator_url + "/healthz", timeout_s=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"coordinator not healthy:\n{tail(self.procs['coordinator'].log_path)}")

    def kill(self, name: str) -> None:
        p = self.procs[name]
        if p.alive:
            p.proc.kill()
        if p.proc is not None:
            p.proc.wait(10)

    def stop(self) -> None:
        if self._zk is not None:
            self._zk.stop()
            self._zk.close()
            self._zk = None
        for name in ["coordinator", *(f"s{i}" for i in self.server_ids()), "zk"]:
            p = self.procs.get(name)
            if p is not None and p.alive:
                p.proc.terminate()
                try:
                    p.proc.wait(15)
                except Exception:  # noqa: BLE001 - a stuck one is killed with the namespaces
                    p.proc.kill()

    def logs(self, lines: int = 60) -> str:
        return "\n".join(
            f"--- {p.name} ({p.log_path}) ---\n{tail(p.log_path, lines)}"
            for p in self.procs.values()
        )

    # -- looking at it ---------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int, replication: int, **kw: int) -> None:
        body = {
            "name": name,
            "partitions": partitions,
            "replication_factor": replication,
            "dedup": "strict",
            **kw,
        }
        status, got = http_json("POST", self.coordinator_url + "/v1/topics", body)
        if status != 200:
            raise RuntimeError(f"create topic {name}: {status} {got}")

    def zk(self) -> KazooClient:
        """A ZooKeeper client of the test's own (from the client host), for reading the
        partition states: who leads, the ISR, and how often they were written."""
        if self._zk is None:
            self._zk = KazooClient(hosts=self.zk_hosts + CHROOT, timeout=10.0)
            self._zk.start(timeout=30)
        return self._zk

    def partition_state(self, topic: str, partition: int) -> tuple[PartitionState, Any]:
        raw, stat = self.zk().get(partition_path(topic, partition))
        return PartitionState.from_bytes(raw), stat

    def leader(self, topic: str, partition: int) -> int:
        return self.partition_state(topic, partition)[0].leader

    def metrics(self, server_id: int, timeout_s: float = 3.0) -> dict[str, float]:
        """``name{labels}`` -> value from a server's ``GET /metrics`` (empty if unreachable)."""
        import urllib.request

        try:
            with urllib.request.urlopen(self.metrics_url(server_id), timeout=timeout_s) as r:
                text = r.read().decode()
        except OSError:
            return {}
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                try:
                    out[key] = float(value)
                except ValueError:
                    continue
        return out

    def log_bytes(self, server_id: int, topic: str, partition: int) -> bytes:
        """The partition's log on that server's disk, its segments in order (the replicas
        are byte-identical when these are equal)."""
        pdir = self.data_dir / f"server-{server_id}" / "data" / f"{topic}-{partition}"
        return b"".join(seg.read_bytes() for seg in sorted(pdir.glob("*.log")))

    def epoch_starts(self, server_id: int, topic: str, partition: int) -> dict[int, int]:
        """``leader epoch -> start offset`` from the replica's leader-epochs file."""
        path = self.data_dir / f"server-{server_id}" / "data" / f"{topic}-{partition}"
        path = path / "leader-epochs"
        if not path.exists():
            return {}
        out = {}
        for line in path.read_text().splitlines()[2:]:
            epoch, start = line.split()
            out[int(epoch)] = int(start)
        return out
