"""The chaos runner: pipelining producers against a real LocalCluster while a seeded
schedule (tests/chaos/schedule.py) injects faults, then the checker (checker.py) reads
every partition and compares it with what the producers were told.

The producers reach the coordinator through a ``pidlease.testing.faultproxy.FaultProxy`` so the
lease API can be blackholed and delayed. Every partition server has a proxy of its own in
front of it: it listens on one port and registers the proxy's as its advertised address
(``PIDLEASE_ADVERTISED_PORT``), so producers, readers, the coordinator's FENCE calls and
the other server's replica fetches all go through it, and the produce path can be cut,
blackholed and delayed too. The SDK's ``drop_connections()`` and SIGSTOP/SIGKILL of the
servers cut it from the other side.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path

from checker import ZOMBIE_MARK, Acked, CheckReport, Fence, check, read_topic
from schedule import Fault, make_schedule

from pidlease import errors
from pidlease.client.producer import Producer
from pidlease.testing.devcluster import LocalCluster, Service, http_json
from pidlease.testing.faultproxy import FaultProxy
from pidlease.testing.zkserver import free_port
from pidlease.wire import protocol as P

TOPIC = "chaos"
SESSION_TIMEOUT_MS = 2_000
SEND_BURST = 50
SEND_PAUSE_S = 0.02
ZOMBIE_SENDS = 20
RESOLVE_TIMEOUT_S = 180.0
PRODUCER_KW: dict[str, int] = {
    "max_in_flight": 5,
    "linger_ms": 5,
    "batch_records_max": 200,
    "buffer_records_max": 5_000,
    "request_timeout_ms": 5_000,
    "start_timeout_ms": 120_000,
}
# Every run has these (a 20 s run may otherwise miss them); the rest is random.
REQUIRED_FAULTS = ("kill_zk_node", "zombie_takeover", "kill_server_torn")
SERVER_ENV = {"PIDLEASE_ZK_SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS)}


@dataclass
class RunResult:
    seed: int
    faults: list[Fault]
    sent: int = 0
    acked: int = 0
    failed: int = 0
    zombie_sends: int = 0
    zombie_refused: int = 0
    torn_tails: int = 0
    truncations_logged: int = 0
    fatal: list[str] = field(default_factory=list)
    report: CheckReport | None = None

    @property
    def ok(self) -> bool:
        return (
            self.report is not None
            and self.report.ok
            and not self.fatal
            and self.zombie_refused == self.zombie_sends
            and self.truncations_logged >= self.torn_tails
        )

    def summary(self) -> str:
        kinds: dict[str, int] = {}
        for f in self.faults:
            kinds[f.kind] = kinds.get(f.kind, 0) + 1
        return (
            f"chaos seed={self.seed}: {len(self.faults)} faults {kinds}; sent {self.sent}, "
            f"acked {self.acked}, failed {self.failed}, zombie sends {self.zombie_sends} "
            f"refused {self.zombie_refused}, torn tails {self.torn_tails} (truncations logged "
            f"{self.truncations_logged}), fatal {self.fatal}\n"
            f"  {self.report.summary() if self.report else 'no check'}"
        )


class Worker:
    """One named producer sending bursts on its own thread until told to stop."""

    def __init__(self, idx: int, url: str, partitions: int) -> None:
        self.name = f"chaos-{idx}"
        self.idx = idx
        self.url = url
        self.partitions = partitions
        self.lock = threading.Lock()  # held while sending; a takeover swaps the producer under it
        self.producer = Producer(url, TOPIC, producer_name=self.name, **PRODUCER_KW)  # type: ignore[arg-type]
        self.retired: list[Producer] = []
        self.futures: list[Future] = []
        self.fatal: str | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"chaos-worker-{idx}", daemon=True)

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set() and self.fatal is None:
            with self.lock:
                try:
                    for _ in range(SEND_BURST):
                        self.futures.append(
                            self.producer.send(b"w%d-%d" % (self.idx, n), key=b"k%d" % (n % 97))
                        )
                        n += 1
                except errors.PidleaseError as exc:
                    self.fatal = f"{self.name}: {exc!r}"
            time.sleep(SEND_PAUSE_S)


class ChaosRun:
    def __init__(
        self,
        cluster: LocalCluster,
        seed: int,
        duration_s: float,
        *,
        producers: int = 2,
        partitions: int = 4,
        server_proxies: list[FaultProxy] | None = None,
    ) -> None:
        self.cluster = cluster
        self.seed = seed
        self.duration_s = duration_s
        self.partitions = partitions
        zk_nodes = len(cluster.zk.nodes) if cluster.zk is not None else 1
        self.faults = make_schedule(
            seed,
            duration_s,
            servers=len(cluster.servers),
            coordinators=len(cluster.coordinators),
            producers=producers,
            zk_nodes=zk_nodes,
            session_expiry_s=SESSION_TIMEOUT_MS / 1000 * 2,
            required=REQUIRED_FAULTS,
        )
        self.result = RunResult(seed, self.faults)
        self.proxy = FaultProxy(cluster.coordinators[0].address)
        self.server_proxies = server_proxies or []
        self.n_producers = producers
        self.fences: list[Fence] = []
        self.zombie_futures: list[Future] = []

    # -- the run ---------------------------------------------------------------------------
    def run(self) -> RunResult:
        print(
            f"chaos seed={self.seed} duration={self.duration_s}s "
            f"(replay: PIDLEASE_CHAOS_SEED={self.seed})",
            flush=True,
        )
        for f in self.faults:
            print("  planned", f.describe(), flush=True)
        self.cluster.create_topic(TOPIC, partitions=self.partitions, dedup="strict")
        self.proxy.start()
        workers: list[Worker] = []
        try:
            workers = [Worker(i, self.proxy.url, self.partitions) for i in range(self.n_producers)]
            for w in workers:
                w.thread.start()
            t0 = time.monotonic()
            for f in self.faults:
                time.sleep(max(0.0, t0 + f.at_s - time.monotonic()))
                self.inject(f, workers)
            time.sleep(max(0.0, t0 + self.duration_s - time.monotonic()))
            for w in workers:
                w.stop.set()
            for w in workers:
                w.thread.join(RESOLVE_TIMEOUT_S)
                if w.thread.is_alive():
                    self.result.fatal.append(
                        f"{w.name}: send still blocked after {RESOLVE_TIMEOUT_S}s"
                    )
            self.collect(workers)
        finally:
            for w in workers:
                for p in [w.producer, *w.retired]:
                    _close_quietly(p)
            self.proxy.close()
        self.result.truncations_logged = sum(
            s.log_path.read_text(errors="replace").count("truncated ") for s in self.cluster.servers
        )
        self.result.report = check(
            read_topic(self.cluster.coordinator_url, TOPIC, self.partitions),
            self.acked,
            self.fences,
        )
        print(self.result.summary(), flush=True)
        return self.result

    def collect(self, workers: list[Worker]) -> None:
        """Wait (bounded) for every send to resolve; note what was acknowledged."""
        deadline = time.monotonic() + RESOLVE_TIMEOUT_S
        self.acked: list[Acked] = []
        for w in workers:
            if w.fatal:
                self.result.fatal.append(w.fatal)
            pid = w.producer.pid
            for fut in w.futures:
                self.result.sent += 1
                try:
                    md = fut.result(timeout=max(0.1, deadline - time.monotonic()))
                except FutureTimeout:
                    self.result.fatal.append(
                        f"{w.name}: a send unresolved after {RESOLVE_TIMEOUT_S}s"
                    )
                    break
                except errors.PidleaseError:
                    self.result.failed += 1
                    continue
                self.result.acked += 1
                self.acked.append(Acked(md.partition, pid, md.sequence_id, md.offset))
        for fut in self.zombie_futures:
            try:
                fut.result(timeout=max(0.1, deadline - time.monotonic()))
            except errors.PidleaseError:
                self.result.zombie_refused += 1
            except FutureTimeout:
                self.result.fatal.append("a zombie send unresolved")

    # -- faults ----------------------------------------------------------------------------
    def inject(self, f: Fault, workers: list[Worker]) -> None:
        print(f"  inject {f.describe()}", flush=True)
        c = self.cluster
        if f.kind in ("kill_server", "kill_server_torn"):
            svc = c.servers[f.target]
            c.kill(svc)
            if f.kind == "kill_server_torn":
                self.result.torn_tails += self.tear_tail(svc)
            time.sleep(f.duration_s)
            c.start_service(svc)
        elif f.kind in ("pause_server", "expire_server_session"):
            self.pause(c.servers[f.target], f.duration_s)
        elif f.kind == "kill_coordinator":
            svc = c.coordinators[f.target]
            c.kill(svc)
            time.sleep(f.duration_s)
            c.start_service(svc)
        elif f.kind == "pause_coordinator":
            self.pause(c.coordinators[f.target], f.duration_s)
        elif f.kind == "drop_connections":
            workers[f.target].producer.drop_connections()
        elif f.kind == "blackhole_coordinator":
            self.proxy.blackhole(f.duration_s)
            time.sleep(f.duration_s)
        elif f.kind == "delay_coordinator":
            self.proxy.set_delay(0.2)
            time.sleep(f.duration_s)
            self.proxy.set_delay(0.0)
        elif f.kind in ("cut_server", "blackhole_server", "delay_server"):
            if not self.server_proxies:
                raise ValueError(f"{f.kind} needs proxies in front of the servers")
            proxy = self.server_proxies[f.target % len(self.server_proxies)]
            if f.kind == "cut_server":
                proxy.drop_all()
            elif f.kind == "blackhole_server":
                proxy.blackhole(f.duration_s)
                time.sleep(f.duration_s)
            else:
                proxy.set_delay(0.2)
                time.sleep(f.duration_s)
                proxy.set_delay(0.0)
        elif f.kind == "zombie_takeover":
            self.takeover(workers[f.target])
        elif f.kind == "kill_zk_node":
            assert c.zk is not None
            node = c.zk.nodes[f.target]
            c.zk.kill_node(node)
            time.sleep(f.duration_s)
            c.zk.start_node(node)
            c.zk.wait_ready(60)
        else:
            raise ValueError(f"unknown fault {f.kind}")

    def pause(self, svc: Service, seconds: float) -> None:
        self.cluster.signal_service(svc, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            self.cluster.signal_service(svc, signal.SIGCONT)

    def tear_tail(self, svc: Service) -> int:
        """Append half a batch to the server's most recently written segment, as a crash
        in the middle of a write leaves it. 1 when a segment was torn."""
        data = self.cluster.data_dir / f"server-{svc.ident}" / "data"
        segs = sorted(data.glob(f"{TOPIC}-*/*.log"), key=lambda p: p.stat().st_mtime)
        if not segs:
            return 0
        batch = P.encode_batch(
            [(b"torn", b"x" * 200)] * 10,
            pid=987654321,
            generation=1,
            base_sequence=0,
            timestamp_ms=int(time.time() * 1000),
        )
        with open(segs[-1], "ab") as fh:
            fh.write(batch[: len(batch) // 2])
        return 1

    def takeover(self, w: Worker) -> None:
        """Take the worker's producer name over; the old producer is now a zombie whose
        sends must all be refused (FENCED), not appended."""
        with w.lock:
            old = w.producer
            new = Producer(w.url, TOPIC, producer_name=w.name, **PRODUCER_KW)  # type: ignore[arg-type]
            self.fences.append(Fence(new.pid, new.generation, self.log_end_offsets()))
            for i in range(ZOMBIE_SENDS):
                self.result.zombie_sends += 1
                try:
                    self.zombie_futures.append(
                        old.send(ZOMBIE_MARK + b"%d" % i, partition=i % self.partitions)
                    )
                except errors.PidleaseError:
                    self.result.zombie_refused += 1
            # The zombie's own unresolved sends stay in w.futures: FENCED ones count as failed.
            w.retired.append(old)
            w.producer = new

    def log_end_offsets(self) -> dict[int, int]:
        status, body = http_json("GET", f"{self.cluster.coordinator_url}/v1/topics/{TOPIC}")
        assert status == 200, body
        # -1 when the leader could not be asked: that partition's fence is then not checked
        return {
            row["partition"]: row["log_end_offset"]
            for row in body["partition_states"]
            if row["log_end_offset"] >= 0
        }


def _close_quietly(p: Producer) -> None:
    with contextlib.suppress(errors.PidleaseError):  # a failed producer closes as well as it can
        p.close(timeout_ms=5_000)


def run_seed(
    data_dir: Path,
    seed: int,
    duration_s: float,
    *,
    zk_hosts: str | None,
    zk_nodes: int = 1,
    servers: int = 2,
) -> tuple[RunResult, LocalCluster]:
    """Start a cluster, run one seeded scenario, stop the cluster (the caller prints its
    logs on failure)."""
    cluster = LocalCluster(data_dir, servers=0, zk_hosts=zk_hosts, zk_nodes=zk_nodes)
    cluster.start()
    proxies: list[FaultProxy] = []
    try:
        for i in range(servers):
            listen_port = free_port()
            proxy = FaultProxy(f"127.0.0.1:{listen_port}").start()
            proxies.append(proxy)
            cluster.add_server(
                i + 1,
                listen_port,
                extra_env={**SERVER_ENV, "PIDLEASE_ADVERTISED_PORT": str(proxy.port)},
            )
        return ChaosRun(cluster, seed, duration_s, server_proxies=proxies).run(), cluster
    finally:
        cluster.stop()
        for proxy in proxies:
            proxy.close()
