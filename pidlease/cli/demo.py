"""``pidlease demo``: exactly-once publishing shown under faults, end to end.

It starts a real local cluster (ZooKeeper, a coordinator, three partition servers as
processes) in a fresh data dir, creates topic ``demo`` (3 partitions, strict), and sends
``records`` keyed records from one producer with ``max_in_flight=5``. Meanwhile, at
moments drawn from a seeded schedule (the seed is printed; ``--seed`` replays it), it cuts
every producer connection (``drop_connections()``) several times and SIGKILLs the server
leading partition 0 twice, restarting it after a short outage. Every acknowledged
(partition, pid, sequence) is recorded; at the end the exactly-once audit
(``pidlease.cli.verify``) reads the whole topic back and checks: every acked record present,
no duplicates, no gaps, sequence order. Exit 0 only when all of that holds.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOPIC = "demo"
PARTITIONS = 3


@dataclass(frozen=True)
class Fault:
    at_record: int
    kind: str  # "drop" | "kill"
    downtime_ms: int = 0


def schedule(seed: int, records: int, *, drops: int = 4, kills: int = 2) -> list[Fault]:
    """The faults of one run, in send order: connection drops anywhere in 5%..95% of the
    records, leader kills in 15%..80%, apart enough that each outage ends first."""
    rng = random.Random(seed)
    faults = [Fault(rng.randint(records // 20, records * 19 // 20), "drop") for _ in range(drops)]
    span = records * 65 // 100 // max(kills, 1)
    for k in range(kills):
        lo = records * 15 // 100 + k * span
        faults.append(Fault(rng.randint(lo, lo + span * 2 // 3), "kill", rng.randint(300, 1500)))
    return sorted(faults, key=lambda f: f.at_record)


class _Acks:
    """Collects acknowledgements from the producer's thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked: list[tuple[int, int, int]] = []
        self.duplicates = 0
        self.failed: list[BaseException] = []
        self.pid = 0

    def __call__(self, fut: Future[Any]) -> None:
        exc = fut.exception()
        with self.lock:
            if exc is not None:
                self.failed.append(exc)
                return
            md = fut.result()
            self.acked.append((md.partition, self.pid, md.sequence_id))
            self.duplicates += md.duplicate


def run_demo(
    *,
    records: int = 200_000,
    data_dir: str | Path | None = None,
    keep: bool = False,
    seed: int | None = None,
    drops: int = 4,
    kills: int = 2,
    out: Callable[[str], None] = print,
) -> int:
    from pidlease.cli.verify import verify_topic
    from pidlease.client.lease_client import LeaseClient
    from pidlease.client.producer import Producer
    from pidlease.testing.devcluster import LocalCluster

    if records < 100:
        raise ValueError("--records must be at least 100")
    if data_dir is None:
        base = Path(tempfile.mkdtemp(prefix="pidlease-demo-"))
    else:
        base = Path(data_dir)
        if base.exists() and any(base.iterdir()):
            raise ValueError(f"{base} is not empty; the demo needs a fresh data dir")
        base.mkdir(parents=True, exist_ok=True)
    seed = random.SystemRandom().randrange(1 << 31) if seed is None else seed
    faults = schedule(seed, records, drops=drops, kills=kills)
    out(
        f"pidlease demo: {records} records, seed {seed} (replay with --seed {seed}), data in {base}"
    )
    out(
        "fault schedule: "
        + ", ".join(
            (
                "drop connections"
                if f.kind == "drop"
                else f"kill leader of p0 for {f.downtime_ms} ms"
            )
            + f" at record {f.at_record}"
            for f in faults
        )
    )
    t0 = time.monotonic()
    cluster = LocalCluster(base / "cluster", servers=3)
    ok = False
    try:
        out("starting ZooKeeper, a coordinator and 3 partition servers...")
        cluster.start()
        cluster.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=1, dedup="strict")
        with LeaseClient(cluster.coordinator_url) as lc:
            leader_id = lc.topic(TOPIC, offsets=False).partition_states[0].leader
        victim = cluster.server(int(leader_id))  # type: ignore[arg-type]
        out(
            f"cluster up at {cluster.coordinator_url} in {time.monotonic() - t0:.1f}s; "
            f"partition 0 is led by server {victim.ident} ({victim.address})"
        )
        ok = _produce_and_verify(
            cluster, victim, faults, records, base, out, Producer, verify_topic
        )
    finally:
        cluster.stop()
        out(f"done in {time.monotonic() - t0:.1f}s")
        if keep or not ok:
            out(f"data kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    return 0 if ok else 1


def _produce_and_verify(
    cluster: Any,
    victim: Any,
    faults: list[Fault],
    records: int,
    base: Path,
    out: Callable[[str], None],
    producer_cls: Any,
    verify_topic: Any,
) -> bool:
    acks = _Acks()
    outage: threading.Thread | None = None
    events: list[str] = []

    def kill_and_restart(fault: Fault) -> None:
        cluster.kill(victim)
        time.sleep(fault.downtime_ms / 1000)
        cluster.start_service(victim)

    step = max(records // 10, 1)
    with producer_cls(
        cluster.coordinator_url, topic=TOPIC, producer_name="demo-producer", max_in_flight=5
    ) as p:
        acks.pid = p.pid
        out(f"producer pid {p.pid} generation {p.generation}, max_in_flight 5")
        pending = list(faults)
        for i in range(records):
            while pending and pending[0].at_record == i:
                fault = pending.pop(0)
                if fault.kind == "drop":
                    p.drop_connections()
                    events.append(f"record {i}: dropped all connections")
                else:
                    if outage is not None:
                        outage.join()
                    outage = threading.Thread(target=kill_and_restart, args=(fault,), daemon=True)
                    outage.start()
                    events.append(
                        f"record {i}: SIGKILL server {victim.ident} (leader of partition 0), "
                        f"restart after {fault.downtime_ms} ms"
                    )
                out(f"  ! {events[-1]}")
            p.send(b"record-%d" % i, key=b"key-%d" % (i % 997)).add_done_callback(acks)
            if (i + 1) % step == 0:
                st = p.stats
                with acks.lock:
                    n_acked = len(acks.acked)
                out(
                    f"  sent {i + 1}/{records}, acked {n_acked}, retries {st['retries']}, "
                    f"batches resent {st['batches_resent']}"
                )
        if outage is not None:
            outage.join()
        p.flush()
        stats = p.stats
    with acks.lock:
        acked = list(acks.acked)
        failed = list(acks.failed)
    out(
        f"all sends resolved: {len(acked)} acked ({acks.duplicates} answered as duplicates of a "
        f"resent batch), {len(failed)} failed; {stats['retries']} retries, "
        f"{stats['batches_resent']} batches resent"
    )
    with open(base / "acked.jsonl", "w") as f:
        f.writelines(
            json.dumps({"partition": part, "pid": pid, "sequence_id": seq}) + "\n"
            for part, pid, seq in acked
        )
    out("reading the topic back and auditing it...")
    report = verify_topic(cluster.coordinator_url, TOPIC, acked=acked)
    out(report.summary())
    present = report.total("acked") - report.total("acked_missing")
    out(
        f"RESULT: records acked {len(acked)}, present {present}, in log {report.total('records')}, "
        f"duplicates {report.total('duplicates')}, missing {report.total('acked_missing')}, "
        f"gaps {report.total('gaps')}, out of order {report.total('out_of_order')}"
    )
    ok = report.ok and not failed and len(acked) == records == report.total("records")
    if ok:
        out(f"DEMO PASSED: exactly-once held through {len(events)} faults")
    elif failed:
        out(f"DEMO FAILED: {len(failed)} sends failed, first: {failed[0]!r}")
    else:
        out("DEMO FAILED: exactly-once did not hold (see above)")
    return ok
