"""``pidlease dev up`` / ``dev down``: a local cluster's lifecycle from the command line.

``up`` starts a ``LocalCluster`` (ZooKeeper, one coordinator on a fixed port, N partition
servers) under a data dir and writes ``<data dir>/dev-cluster.json``: the coordinator URL,
the ZooKeeper hosts and the process id and command line of every process. In the
foreground it then waits for Ctrl-C or SIGTERM and stops everything; with ``--detach`` it
returns and leaves the processes running (they are in their own sessions). ``down`` reads
the state file and stops whatever is still running: the foreground supervisor if there is
one (it cleans up after itself), else each process, gently first (SIGTERM), then SIGKILL.
A process id is only signalled while its command line still matches what was started, so
a reused pid is never hit.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

STATE_FILE = "dev-cluster.json"
DEFAULT_DATA_DIR = "pidlease-data"
DEFAULT_PORT = 8470


class DevError(Exception):
    """A problem the user can fix; the message says how."""


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def _alive(pid: int, marker: str) -> bool:
    """``pid`` is running and is still the process we started (its command line holds
    ``marker``); zombies count as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        return False
    return marker in _cmdline(pid)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def read_state(data_dir: Path) -> dict[str, Any] | None:
    path = data_dir / STATE_FILE
    if not path.exists():
        return None
    try:
        return dict(json.loads(path.read_text()))
    except ValueError as exc:
        raise DevError(
            f"{path} is not valid JSON ({exc}); delete it if no cluster is running"
        ) from exc


def _running(state: dict[str, Any]) -> list[dict[str, Any]]:
    procs = list(state.get("processes", []))
    sup = state.get("supervisor")
    if sup:
        procs.append(sup)
    return [p for p in procs if _alive(int(p["pid"]), str(p["marker"]))]


def _state_of(cluster: Any, *, detached: bool, replication_factor: int) -> dict[str, Any]:
    procs = []
    for svc in cluster.coordinators + cluster.servers:
        if svc.proc is not None:
            procs.append(
                {
                    "kind": svc.kind,
                    "ident": svc.ident,
                    "pid": svc.proc.pid,
                    "marker": f"-m {svc.kind}",
                    "address": svc.address,
                }
            )
    if cluster.zk is not None:
        for node in cluster.zk.nodes:
            if node.proc is not None:
                procs.append(
                    {
                        "kind": "zookeeper",
                        "ident": node.myid,
                        "pid": node.proc.pid,
                        "marker": "QuorumPeerMain",
                        "address": f"127.0.0.1:{node.client_port}",
                    }
                )
    state: dict[str, Any] = {
        "coordinator_url": cluster.coordinator_url,
        "zk_hosts": cluster.zk_hosts,
        "kafka_bootstrap": cluster.kafka_bootstrap,
        "data_dir": str(cluster.data_dir),
        "replication_factor": replication_factor,
        "started_ms": int(time.time() * 1000),
        "processes": procs,
    }
    if not detached:
        state["supervisor"] = {"kind": "supervisor", "pid": os.getpid(), "marker": "dev up"}
    return state


def up(
    *,
    data_dir: Path,
    servers: int,
    replication_factor: int,
    zk_nodes: int,
    port: int,
    zk_hosts: str | None,
    detach: bool,
    out: Callable[[str], None] = print,
) -> int:
    from pidlease.testing.devcluster import LocalCluster

    if servers < 1:
        raise DevError("--servers must be at least 1")
    if not 1 <= replication_factor <= servers:
        raise DevError(
            f"--replication-factor {replication_factor} needs 1..{servers} servers "
            f"(raise --servers)"
        )
    if zk_nodes not in (1, 3):
        raise DevError("--zk-nodes must be 1 or 3")
    data_dir = data_dir.absolute()
    old = read_state(data_dir)
    if old is not None and _running(old):
        raise DevError(
            f"a dev cluster is already running from {data_dir} "
            f"({old.get('coordinator_url')}); stop it with: pidlease dev down --data-dir {data_dir}"
        )
    if not _port_free(port):
        raise DevError(
            f"port {port} on 127.0.0.1 is in use (another dev cluster? try `pidlease dev down`), "
            f"or choose another with --port"
        )
    out(
        f"starting a local cluster in {data_dir}: "
        f"{'ZooKeeper at ' + zk_hosts if zk_hosts else f'ZooKeeper ({zk_nodes} node(s))'}, "
        f"1 coordinator, {servers} partition server(s)..."
    )
    cluster = LocalCluster(
        data_dir,
        servers=servers,
        zk_nodes=zk_nodes,
        zk_hosts=zk_hosts,
        coordinator_ports=[port],
        # The cluster's default for `topic create` without --replication-factor (issue 29).
        env={"PIDLEASE_TOPIC_REPLICATION_FACTOR_DEFAULT": str(replication_factor)},
    )
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    state = _state_of(cluster, detached=detach, replication_factor=replication_factor)
    (data_dir / STATE_FILE).write_text(json.dumps(state, indent=2))
    out(f"coordinator: {cluster.coordinator_url}")
    out(f"zookeeper:   {cluster.zk_hosts}")
    for svc in cluster.servers:
        out(
            f"partition server {svc.ident}: {svc.address}, kafka {svc.kafka_address} "
            f"(log {svc.log_path})"
        )
    out(f"kafka bootstrap: {cluster.kafka_bootstrap}")
    out(
        "try:  pidlease topic create orders --partitions 3   "
        f"(replication factor {replication_factor}: this cluster's default)"
    )
    if detach:
        # The processes outlive us on purpose (`dev down` stops them by pid); mark the
        # Popen objects finished so their destructors do not warn about running children.
        procs = [svc.proc for svc in cluster.coordinators + cluster.servers]
        procs += [node.proc for node in (cluster.zk.nodes if cluster.zk is not None else [])]
        for proc in procs:
            if proc is not None:
                proc.returncode = 0
        out(f"running in the background; stop it with: pidlease dev down --data-dir {data_dir}")
        return 0
    out("running; press Ctrl-C (or run `pidlease dev down` elsewhere) to stop")
    stop = {"now": False}

    def on_signal(_sig: int, _frame: Any) -> None:
        stop["now"] = True

    old_term = signal.signal(signal.SIGTERM, on_signal)
    reported: set[str] = set()
    try:
        while not stop["now"]:
            time.sleep(0.3)
            for svc in cluster.coordinators + cluster.servers:
                name = f"{svc.kind} {svc.ident}"
                if svc.proc is not None and svc.proc.poll() is not None and name not in reported:
                    reported.add(name)
                    out(f"warning: {name} exited with {svc.proc.returncode}; see {svc.log_path}")
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, old_term)
        out("stopping the cluster...")
        cluster.stop()
        (data_dir / STATE_FILE).unlink(missing_ok=True)
        out("stopped")
    return 0


def _terminate(pid: int, marker: str, timeout_s: float) -> None:
    if not _alive(pid, marker):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid, marker):
            return
        time.sleep(0.1)
    if _alive(pid, marker):
        os.kill(pid, signal.SIGKILL)


def down(*, data_dir: Path, out: Callable[[str], None] = print, timeout_s: float = 20.0) -> int:
    data_dir = data_dir.absolute()
    state = read_state(data_dir)
    if state is None:
        raise DevError(
            f"no dev cluster state in {data_dir} ({STATE_FILE} is missing); "
            f"is one running? Pass the --data-dir it was started with."
        )
    sup = state.get("supervisor")
    if sup and _alive(int(sup["pid"]), str(sup["marker"])):
        out(f"asking the dev up process {sup['pid']} to stop the cluster...")
        _terminate(int(sup["pid"]), str(sup["marker"]), timeout_s + 30)
    order = {"coordinator": 0, "partition_server": 1, "zookeeper": 2}
    for p in sorted(state.get("processes", []), key=lambda p: order.get(p["kind"], 9)):
        if _alive(int(p["pid"]), str(p["marker"])):
            out(f"stopping {p['kind']} {p['ident']} (pid {p['pid']})")
            _terminate(int(p["pid"]), str(p["marker"]), timeout_s)
    (data_dir / STATE_FILE).unlink(missing_ok=True)
    out("dev cluster stopped")
    return 0
