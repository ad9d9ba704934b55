"""A real local cluster on 127.0.0.1: ZooKeeper, coordinators and partition servers as
separate processes with their own files.

Used by ``pidlease dev up``, the demo, the benchmarks and the integration tests (which is
why it is public, like ``trio.testing``). Every service is started with ``sys.executable
-m coordinator`` / ``-m partition_server`` and configured through ``PIDLEASE_*``
environment variables, exactly as an operator would run them. Fault helpers
(``kill``, ``restart``, ``stop_service``, ``signal_service``) send real signals.

``LocalCluster(..., tls=True)`` makes a CA and a certificate for 127.0.0.1 with the
``openssl`` command line (``make_certs``) under ``<data_dir>/tls`` and turns TLS on for every
coordinator (HTTPS) and partition server; ``cluster.ca_file`` is what clients trust
(``Producer(..., tls_ca_file=cluster.ca_file)``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pidlease.testing.zkserver import ZooKeeperCluster, free_port

DEV_SECRET = "pidlease-dev-secret"  # noqa: S105 - the servers' development default


@dataclass
class Service:
    kind: str  # "coordinator" | "partition_server"
    ident: int
    port: int
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    metrics_port: int = 0  # partition servers: their GET /metrics listener
    tls: bool = False  # serves TLS (HTTPS for a coordinator)
    kafka_port: int = 0  # partition servers: their Kafka listener (0: none)

    @property
    def kafka_address(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def _wait_tcp(
    port: int,
    proc: subprocess.Popen[bytes],
    timeout_s: float,
    what: str,
    log: Path,
    ssl_context: ssl.SSLContext | None = None,
) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{tail(log)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                if ssl_context is not None:  # a full handshake: no failed one in the logs
                    ssl_context.wrap_socket(sock, server_hostname="127.0.0.1").close()
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"{what} did not listen on {port} within {timeout_s}s:\n{tail(log)}")


def tail(path: Path, lines: int = 80) -> str:
    if not path.exists():
        return f"(no log at {path})"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def make_certs(
    out_dir: str | Path, *, hosts: tuple[str, ...] = ("127.0.0.1",), days: int = 30
) -> dict[str, Path]:
    """A throwaway CA and a server certificate it signs (subjectAltName: every IP or DNS
    name in ``hosts``), made with the ``openssl`` command line. Returns the paths of
    ``ca`` (the bundle clients trust), ``cert`` and ``key`` (the servers')."""
    openssl = shutil.which("openssl") or "/usr/bin/openssl"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "ca": out / "ca.pem",
        "ca_key": out / "ca.key",
        "cert": out / "server.pem",
        "key": out / "server.key",
        "csr": out / "server.csr",
        "ext": out / "server.ext",
    }
    san = ",".join(
        f"IP:{h}" if h.replace(".", "").isdigit() or ":" in h else f"DNS:{h}" for h in hosts
    )
    paths["ext"].write_text(
        f"subjectAltName={san}\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
    )

    def run(*args: str) -> None:
        r = subprocess.run(
            [openssl, *args], check=False, capture_output=True, text=True, timeout=60
        )
        if r.returncode != 0:
            raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {r.stderr.strip()}")

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(paths["ca_key"]),
        "-out",
        str(paths["ca"]),
        "-days",
        str(days),
        "-subj",
        "/CN=pidlease test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    run(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(paths["key"]),
        "-out",
        str(paths["csr"]),
        "-subj",
        f"/CN={hosts[0]}",
    )
    run(
        "x509",
        "-req",
        "-in",
        str(paths["csr"]),
        "-CA",
        str(paths["ca"]),
        "-CAkey",
        str(paths["ca_key"]),
        "-CAcreateserial",
        "-out",
        str(paths["cert"]),
        "-days",
        str(days),
        "-extfile",
        str(paths["ext"]),
    )
    for k in ("ca_key", "key"):
        paths[k].chmod(0o600)
    return {k: paths[k] for k in ("ca", "cert", "key")}


def http_json(
    method: str,
    url: str,
    body: dict[str, Any] | None = None,
    timeout_s: float = 10.0,
    *,
    ca_file: str | Path | None = None,
) -> tuple[int, dict[str, Any]]:
    """A tiny JSON HTTP call with no dependencies: (status, body). An ``https://`` URL is
    verified against ``ca_file`` (else ``PIDLEASE_TLS_CA_FILE``, else the system store)."""
    from pidlease.wire.tls import client_ssl_context

    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, method=method, headers={"content-type": "application/json"}
    )
    ctx = (
        client_ssl_context(str(ca_file) if ca_file else None) if url.startswith("https:") else None
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s, context=ctx) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, {"raw": raw.decode(errors="replace")}


class LocalCluster:
    """ZooKeeper (1 or 3 nodes) + ``coordinators`` coordinators + ``servers`` partition
    servers under ``data_dir``. ``zk_hosts`` may point at an existing ZooKeeper (tests pass
    a per-test chroot of a session-wide server); then no ZooKeeper is started."""

    def __init__(
        self,
        data_dir: str | Path,
        *,
        servers: int = 1,
        coordinators: int = 1,
        zk_nodes: int = 1,
        zk_hosts: str | None = None,
        chroot: str = "/pidlease",
        secret: str = DEV_SECRET,
        env: dict[str, str] | None = None,
        coordinator_ports: list[int] | None = None,
        server_ports: list[int] | None = None,
        tls: bool = False,
        kafka: bool = True,
    ) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.zk: ZooKeeperCluster | None = None
        self._zk_nodes = zk_nodes
        self._zk_hosts_given = zk_hosts
        self.chroot = chroot
        self.secret = secret
        self.base_env = dict(env or {})
        self.coordinators: list[Service] = []
        self.servers: list[Service] = []
        self._n_coord = coordinators
        self._n_servers = servers
        self._coord_ports = coordinator_ports
        self._server_ports = server_ports
        self.tls = tls
        self.kafka = kafka  # each partition server also listens for Kafka clients
        self.certs: dict[str, Path] = {}
        if tls:
            self.certs = make_certs(self.data_dir / "tls")

    @property
    def ca_file(self) -> str | None:
        """The CA bundle clients of a ``tls=True`` cluster trust (None without TLS)."""
        return str(self.certs["ca"]) if self.certs else None

    def client_ssl_context(self) -> ssl.SSLContext | None:
        from pidlease.wire.tls import client_ssl_context

        return client_ssl_context(self.ca_file, use_env=False) if self.tls else None

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def zk_hosts(self) -> str:
        if self._zk_hosts_given:
            return self._zk_hosts_given
        assert self.zk is not None, "ZooKeeper not started"
        return self.zk.hosts + self.chroot

    @property
    def coordinator_url(self) -> str:
        return self.coordinators[0].url

    @property
    def kafka_bootstrap(self) -> str:
        """``bootstrap.servers`` for a Kafka client: every partition server's Kafka port."""
        return ",".join(s.kafka_address for s in self.servers if s.kafka_port)

    def common_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "PIDLEASE_ZK": self.zk_hosts,
                "PIDLEASE_LEASE_SECRET": self.secret,
                "PYTHONUNBUFFERED": "1",
            }
        )
        if self.certs:
            env.update(
                {
                    "PIDLEASE_TLS_CERTFILE": str(self.certs["cert"]),
                    "PIDLEASE_TLS_KEYFILE": str(self.certs["key"]),
                    "PIDLEASE_TLS_CA_FILE": str(self.certs["ca"]),
                }
            )
        env.update(self.base_env)
        return env

    def start(self, timeout_s: float = 60.0) -> LocalCluster:
        if self._zk_hosts_given is None:
            self.zk = ZooKeeperCluster(self.data_dir / "zookeeper", self._zk_nodes).start(timeout_s)
        for i in range(self._n_servers):
            port = self._server_ports[i] if self._server_ports else free_port()
            self.add_server(i + 1, port, start=True, timeout_s=timeout_s)
        for i in range(self._n_coord):
            port = self._coord_ports[i] if self._coord_ports else free_port()
            self.add_coordinator(i + 1, port, timeout_s=timeout_s)
        return self

    def add_server(
        self,
        ident: int,
        port: int | None = None,
        *,
        start: bool = True,
        timeout_s: float = 60.0,
        extra_env: dict[str, str] | None = None,
    ) -> Service:
        port = port or free_port()
        sdir = self.data_dir / f"server-{ident}"
        sdir.mkdir(parents=True, exist_ok=True)
        svc = Service(
            "partition_server",
            ident,
            port,
            {},
            sdir / "server.log",
            extra_env=dict(extra_env or {}),
            metrics_port=free_port(),
            tls=self.tls,
            kafka_port=free_port() if self.kafka else 0,
        )
        self.servers.append(svc)
        if start:
            self.start_service(svc, timeout_s)
        return svc

    def add_coordinator(
        self,
        ident: int,
        port: int | None = None,
        *,
        timeout_s: float = 60.0,
        extra_env: dict[str, str] | None = None,
    ) -> Service:
        port = port or free_port()
        cdir = self.data_dir / f"coordinator-{ident}"
        cdir.mkdir(parents=True, exist_ok=True)
        svc = Service(
            "coordinator",
            ident,
            port,
            {},
            cdir / "coordinator.log",
            extra_env=dict(extra_env or {}),
            tls=self.tls,
        )
        self.coordinators.append(svc)
        self.start_service(svc, timeout_s)
        return svc

    def _service_env(self, svc: Service) -> dict[str, str]:
        env = self.common_env()
        if svc.kind == "coordinator":
            env.update(
                {
                    "PIDLEASE_HTTP_HOST": "127.0.0.1",
                    "PIDLEASE_HTTP_PORT": str(svc.port),
                    "PIDLEASE_COORDINATOR_ID": f"coordinator-{svc.ident}",
                }
            )
        else:
            env.update(
                {
                    "PIDLEASE_SERVER_ID": str(svc.ident),
                    "PIDLEASE_HOST": "127.0.0.1",
                    "PIDLEASE_PORT": str(svc.port),
                    "PIDLEASE_METRICS_PORT": str(svc.metrics_port),
                    "PIDLEASE_KAFKA_PORT": str(svc.kafka_port),
                    "PIDLEASE_DATA_DIR": str(self.data_dir / f"server-{svc.ident}" / "data"),
                }
            )
        env.update(svc.extra_env)
        return env

    def start_service(self, svc: Service, timeout_s: float = 60.0) -> None:
        if svc.alive:
            return
        # The child keeps its own copy of the descriptor; ours closes once it is spawned.
        with open(svc.log_path, "ab") as log:
            log.write(
                f"\n=== start {svc.kind} {svc.ident} at {time.strftime('%H:%M:%S')} ===\n".encode()
            )
            log.flush()
            svc.proc = subprocess.Popen(
                [sys.executable, "-m", svc.kind],
                env=self._service_env(svc),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        _wait_tcp(
            svc.port,
            svc.proc,
            timeout_s,
            f"{svc.kind} {svc.ident}",
            svc.log_path,
            self.client_ssl_context(),
        )
        if svc.kind == "coordinator":
            self._wait_healthy(svc, timeout_s)

    def _wait_healthy(self, svc: Service, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last: object = None
        while time.monotonic() < deadline:
            try:
                status, body = http_json(
                    "GET", svc.url + "/healthz", timeout_s=2, ca_file=self.ca_file
                )
                if status == 200:
                    return
                last = body
            except OSError as exc:
                last = exc
            time.sleep(0.1)
        raise TimeoutError(f"coordinator {svc.ident} not healthy: {last}\n{tail(svc.log_path)}")

    def signal_service(self, svc: Service, sig: int) -> None:
        if svc.proc is not None and svc.proc.poll() is None:
            os.kill(svc.proc.pid, sig)

    def kill(self, svc: Service) -> None:
        """SIGKILL, and wait until the process is gone."""
        if svc.proc is not None:
            if svc.proc.poll() is None:
                svc.proc.send_signal(signal.SIGKILL)
            svc.proc.wait(10)
            svc.proc = None

    def stop_service(self, svc: Service, timeout_s: float = 15.0) -> None:
        if svc.proc is None:
            return
        if svc.proc.poll() is None:
            svc.proc.send_signal(signal.SIGTERM)
            try:
                svc.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                svc.proc.kill()
                svc.proc.wait(5)
        svc.proc = None

    def restart(self, svc: Service, timeout_s: float = 60.0) -> None:
        self.kill(svc)
        self.start_service(svc, timeout_s)

    def server(self, ident: int) -> Service:
        return next(s for s in self.servers if s.ident == ident)

    def stop(self) -> None:
        for svc in self.coordinators + self.servers:
            self.stop_service(svc)
        if self.zk is not None:
            self.zk.stop()

    def logs(self, lines: int = 60) -> str:
        parts = [
            f"--- {s.kind} {s.ident} ({s.log_path}) ---\n{tail(s.log_path, lines)}"
            for s in self.coordinators + self.servers
        ]
        if self.zk is not None:
            parts.append(self.zk.tail_logs(lines))
        return "\n".join(parts)

    # -- conveniences ----------------------------------------------------------------------
    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int = 1,
        dedup: str = "strict",
        **settings: int,
    ) -> dict[str, Any]:
        """``settings``: log settings (``retention_ms``, ``retention_bytes``,
        ``segment_bytes``, ``segment_ms``, ``min_insync_replicas``)."""
        status, body = http_json(
            "POST",
            self.coordinator_url + "/v1/topics",
            {
                "name": name,
                "partitions": partitions,
                "replication_factor": replication_factor,
                "dedup": dedup,
                **settings,
            },
            ca_file=self.ca_file,
        )
        if status != 200:
            raise RuntimeError(f"create topic {name}: {status} {body}")
        return body

    def alter_topic(self, name: str, **settings: int) -> dict[str, Any]:
        """``PATCH /v1/topics/{name}``: change some log settings; the answer's settings."""
        status, body = http_json(
            "PATCH", f"{self.coordinator_url}/v1/topics/{name}", settings, ca_file=self.ca_file
        )
        if status != 200:
            raise RuntimeError(f"alter topic {name}: {status} {body}")
        return body

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
