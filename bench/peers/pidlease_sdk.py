"""pidlease through its SDK: a real local cluster (ZooKeeper, one coordinator, one
partition server, as processes; ``pidlease.testing.devcluster.LocalCluster``), producers using
``pidlease.Producer.send`` at its default settings.

Pass 1 sends with the producer's own numbering (the default ``send(value)``). Pass 2 is
what a replayable source does after a restart: a new producer takes the same
``producer_name`` over (raising the generation, fencing the old one) and re-sends the same
records with their sequence ids; the lease says which are durable, so the SDK resolves
every one as ``duplicate=True``. (The server's own DUPLICATE path, for resends of batches
whose answer was lost, is measured on the wire in ``bench/pidlease_alone.py``.)

The CPU and peak RSS reported are the partition server's: ZooKeeper and the coordinator
are off the data path (they serve one lease per producer here).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.workload import LATENCY_EVERY, Outcome, clock, payload
from pidlease.testing.devcluster import LocalCluster

SERVER_ENV = {"PIDLEASE_SEGMENT_BYTES_MAX": str(256 * 1024 * 1024)}


class System:
    producer = "bench.peers.pidlease_sdk:produce"

    def __init__(
        self,
        workdir: Path,
        *,
        dedup: str = "strict",
        partitions: int = 1,
        replication_factor: int = 1,
        env: dict[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.mode = dedup
        self.partitions = partitions
        self.rf = replication_factor
        self.env = {**SERVER_ENV, **(env or {})}
        self.dedup = dedup != "off"
        self.key = f"pidlease-r{replication_factor}-{dedup}"
        self.name = f"pidlease R={replication_factor} {dedup} (SDK send)"
        self.cluster: LocalCluster | None = None
        self.runs = 0

    def start(self) -> None:
        self.cluster = LocalCluster(
            self.workdir / self.key, servers=self.rf, coordinators=1, env=self.env
        ).start()

    def server_pids(self) -> list[int]:
        assert self.cluster is not None
        return [s.proc.pid for s in self.cluster.servers if s.proc is not None]

    def prepare(self, value_bytes: int, dedup: str | None = None) -> dict[str, Any]:
        """A new topic (dedup mode of this system unless given) for one run."""
        assert self.cluster is not None
        self.runs += 1
        topic = f"bench{self.runs}"
        self.cluster.create_topic(topic, self.partitions, self.rf, dedup or self.mode)
        return {"url": self.cluster.coordinator_url, "topic": topic}

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()


def produce(
    cfg: dict[str, Any],
    index: int,
    phase: str,
    value_bytes: int,
    records: int,
    ready: Callable[[], Any],
) -> Outcome:
    from pidlease import Producer

    value = payload(value_bytes, index)
    out = Outcome(index, records)
    lat = out.latencies_s
    resend = phase == "resend"
    with Producer(
        cfg["url"],
        topic=cfg["topic"],
        producer_name=f"{cfg['topic']}-{index}",
        **cfg.get("settings", {}),
    ) as p:
        send = p.send
        futs = []
        ready()
        cpu0 = time.process_time()
        out.started = clock()
        for j in range(records):
            t = clock() if j % LATENCY_EVERY == 0 else 0.0
            fut = send(value, sequence_id=j) if resend else send(value)
            if t:
                fut.add_done_callback(lambda _f, t=t: lat.append(clock() - t))
            futs.append(fut)
        p.flush()
        out.finished = clock()
        out.client_cpu_s = time.process_time() - cpu0
    for fut in futs:
        exc = fut.exception()
        if exc is not None:
            out.errors += 1
            out.error_sample = out.error_sample or repr(exc)
        elif fut.result().duplicate:
            out.duplicates += 1
        else:
            out.acked += 1
    return out
