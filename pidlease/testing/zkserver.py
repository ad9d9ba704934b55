"""A real ZooKeeper (Debian's ``zookeeper`` 3.8 package) run by the project on 127.0.0.1.

Used by ``pidlease dev up``, the demo and the tests. A standalone server or a 3-node
ensemble, each node a ``java ... QuorumPeerMain`` process with its data and log under the
caller's directory. Nothing here touches /etc or /var.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

ZK_JAR = Path("/usr/share/java/zookeeper.jar")
SLF4J_JAR = Path("/usr/share/java/slf4j-simple.jar")
MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
INSTALL_HINT = (
    "ZooKeeper is not installed. Install Debian's package with:\n"
    "  sudo apt-get update && sudo apt-get install -y --no-install-recommends zookeeper"
)


class ZooKeeperMissing(RuntimeError):
    pass


def check_installed() -> None:
    if not ZK_JAR.exists() or shutil.which("java") is None:
        raise ZooKeeperMissing(INSTALL_HINT)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def four_letter(host: str, port: int, cmd: str = "srvr", timeout_s: float = 1.0) -> str:
    with socket.create_connection((host, port), timeout=timeout_s) as s:
        s.sendall(cmd.encode())
        chunks = []
        while True:
            data = s.recv(4096)
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks).decode(errors="replace")


@dataclass
class ZkNode:
    myid: int
    client_port: int
    peer_port: int
    election_port: int
    data_dir: Path
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.data_dir / "zookeeper.log"

    def mode(self) -> str | None:
        try:
            out = four_letter("127.0.0.1", self.client_port)
        except OSError:
            return None
        for line in out.splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return None


class ZooKeeperCluster:
    """One standalone server (``nodes=1``) or an ensemble (``nodes=3``) on 127.0.0.1."""

    def __init__(
        self,
        base_dir: str | Path,
        nodes: int = 1,
        *,
        client_ports: list[int] | None = None,
        heap_mb: int = 256,
    ) -> None:
        check_installed()
        if nodes not in (1, 3):
            raise ValueError("nodes must be 1 or 3")
        self.base_dir = Path(base_dir)
        self.heap_mb = heap_mb
        ports = client_ports or [free_port() for _ in range(nodes)]
        self.nodes = [
            ZkNode(i + 1, ports[i], free_port(), free_port(), self.base_dir / f"zk{i + 1}")
            for i in range(nodes)
        ]

    @property
    def hosts(self) -> str:
        return ",".join(f"127.0.0.1:{n.client_port}" for n in self.nodes)

    def _write_config(self, node: ZkNode) -> Path:
        node.data_dir.mkdir(parents=True, exist_ok=True)
        lines = [
            # A short tick: sessions may be as short as 2 ticks, and expire within one
            # tick of their timeout (partition servers ask 1,200 ms; docs/replication.md).
            # The maximum stays where a 2,000 ms tick put it for everyone else.
            "tickTime=250",
            "minSessionTimeout=500",
            "maxSessionTimeout=120000",
            f"dataDir={node.data_dir}",
            f"clientPort={node.client_port}",
            "clientPortAddress=127.0.0.1",
            "admin.enableServer=false",
            "4lw.commands.whitelist=*",
            "maxClientCnxns=0",
            "autopurge.snapRetainCount=3",
            "autopurge.purgeInterval=1",
        ]
        if len(self.nodes) > 1:
            lines += ["initLimit=80", "syncLimit=40"]  # in ticks: 20 s and 10 s, as before
            lines += [
                f"server.{n.myid}=127.0.0.1:{n.peer_port}:{n.election_port}" for n in self.nodes
            ]
            (node.data_dir / "myid").write_text(f"{node.myid}\n")
        cfg = node.data_dir / "zoo.cfg"
        cfg.write_text("\n".join(lines) + "\n")
        return cfg

    def start_node(self, node: ZkNode) -> None:
        cfg = self._write_config(node)
        cp = f"{node.data_dir}:{ZK_JAR}:{SLF4J_JAR}"
        # The child keeps its own copy of the descriptor; ours closes once it is spawned.
        with open(node.log_path, "ab") as log:
            node.proc = subprocess.Popen(
                [
                    "java",
                    f"-Xmx{self.heap_mb}m",
                    "-Dzookeeper.admin.enableServer=false",
                    "-cp",
                    cp,
                    MAIN_CLASS,
                    str(cfg),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def start(self, timeout_s: float = 30.0) -> ZooKeeperCluster:
        for node in self.nodes:
            self.start_node(node)
        self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        want = {"standalone"} if len(self.nodes) == 1 else {"leader", "follower"}
        while time.monotonic() < deadline:
            live = [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]
            modes = [n.mode() for n in live]
            if len(self.nodes) == 1 and modes and modes[0] in want:
                return
            if len(self.nodes) > 1 and "leader" in modes and sum(m in want for m in modes) >= 2:
                return
            for n in self.nodes:
                if n.proc is not None and n.proc.poll() is not None and len(self.nodes) == 1:
                    raise RuntimeError(
                        f"ZooKeeper exited with {n.proc.returncode}:\n{self.tail_logs()}"
                    )
            time.sleep(0.1)
        raise TimeoutError(f"ZooKeeper not ready after {timeout_s}s:\n{self.tail_logs()}")

    def stop_node(self, node: ZkNode, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> None:
        if node.proc is None:
            return
        if node.proc.poll() is None:
            node.proc.send_signal(sig)
            try:
                node.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait(5)
        node.proc = None

    def kill_node(self, node: ZkNode) -> None:
        self.stop_node(node, signal.SIGKILL)

    def stop(self) -> None:
        for node in self.nodes:
            self.stop_node(node)

    def restart(self, timeout_s: float = 30.0) -> None:
        for node in self.nodes:
            if node.proc is None or node.proc.poll() is not None:
                self.start_node(node)
        self.wait_ready(timeout_s)

    def tail_logs(self, lines: int = 60) -> str:
        out = []
        for n in self.nodes:
            if n.log_path.exists():
                text = n.log_path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- ZooKeeper node {n.myid} ({n.log_path}) ---\n" + "\n".join(text))
        return "\n".join(out)

    def __enter__(self) -> ZooKeeperCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True
