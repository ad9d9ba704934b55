"""The one command: pidlease side by side with NATS JetStream, Redis Streams and a bare
Python append server (the ceiling), plus the figures only pidlease has.

    .venv/bin/python -m bench.compare --records 200000 --producers 2

starts every server it needs on 127.0.0.1 under a temporary directory, runs the workload
of ``bench/workload.py`` (pass 1: every record acknowledged; pass 2: the same records
again, every one must be recognised as a duplicate) against each system in turn, stops
them, prints the table and writes ``docs/benchmarks.md`` (its generated section) and
``docs/img/throughput.png``. Figures from one run are comparable with each other; the
machine is shared, so absolute numbers are noisy: read the ratios.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import pidlease_alone, report
from bench.peers import ceiling, nats_jetstream, pidlease_sdk, redis_streams
from bench.procstats import ProcWatch
from bench.report import Row
from bench.runner import run_producers
from bench.workload import LATENCY_EVERY, Outcome, PassResult, clock, payload, summarize

ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = (
    "ceiling",
    "pidlease",
    "pidlease-batch",
    "pidlease-r3",
    "confluent-kafka",
    "aiokafka",
    "nats",
    "redis-function",
    "redis-xadd",
)
BATCH_CALL_RECORDS = 10_000  # records per send_batch call in the pidlease-batch system

# librdkafka settings of the confluent-kafka system, chosen by a sweep (docs/benchmarks.md,
# "Kafka clients against pidlease"): librdkafka's own batching (linger.ms 5, its default,
# stated so a new default does not move the figures; batches up to 10,000 records / 1 MB),
# which beat capping batches at the SDK's 1,000 records (the server's cost is mostly per
# request), and a local queue deep enough that produce() seldom meets BufferError (which
# would time the client's back-off, not the server).
KAFKA_PRODUCER_SETTINGS: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 5,
    "queue.buffering.max.messages": 1_000_000,
}
KAFKA_POLL_EVERY = 1000  # serve delivery callbacks this often, so sampled latencies are real


class BatchSystem(pidlease_sdk.System):
    """pidlease through ``Producer.send_batch``: the same cluster, topic and passes as the
    ``pidlease`` system, each producer handing its records over ``BATCH_CALL_RECORDS`` at
    a time (a Python list of bytes; pass 2 with explicit ``sequence_ids``)."""

    producer = "bench.compare:produce_batch"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.key = "pidlease-r1-strict-batch"
        self.name = "pidlease R=1 strict (SDK send_batch)"


def produce_batch(
    cfg: dict[str, Any],
    index: int,
    phase: str,
    value_bytes: int,
    records: int,
    ready: Any,
) -> Outcome:
    """One producer of the pidlease-batch system (runs in a child process)."""
    from pidlease import Producer

    value = payload(value_bytes, index)
    out = Outcome(index, records)
    lat = out.latencies_s
    resend = phase == "resend"
    with Producer(cfg["url"], topic=cfg["topic"], producer_name=f"{cfg['topic']}-{index}") as p:
        futs = []
        ready()
        cpu0 = time.process_time()
        out.started = clock()
        for start in range(0, records, BATCH_CALL_RECORDS):
            n = min(BATCH_CALL_RECORDS, records - start)
            t = clock()
            ids = list(range(start, start + n)) if resend else None
            fut = p.send_batch([value] * n, sequence_ids=ids)
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
            continue
        metas = fut.result()
        out.duplicates += metas.duplicates
        out.acked += len(metas) - metas.duplicates
    return out


class KafkaSystem(pidlease_sdk.System):
    """A Kafka client producing to pidlease's Kafka listener: the same cluster kind and
    1-partition topic as the ``pidlease`` system (R=1, strict), each producer an idempotent
    Kafka producer (``acks=all``) of its own. Produce pass only: a Kafka producer's
    idempotence covers its own retries within one session, so there is no resend pass a
    new client could be asked to have recognised."""

    def __init__(self, workdir: Path, client: str) -> None:
        super().__init__(workdir)
        self.dedup = False
        self.key = client
        self.name = f"pidlease R=1 strict ({client} idempotent, acks=all)"
        self.producer = f"bench.compare:produce_{client.replace('-', '_')}"

    def prepare(self, value_bytes: int, dedup: str | None = None) -> dict[str, Any]:
        cfg = super().prepare(value_bytes, dedup)
        assert self.cluster is not None
        return {**cfg, "bootstrap": self.cluster.kafka_bootstrap}


def produce_confluent_kafka(
    cfg: dict[str, Any],
    index: int,
    phase: str,
    value_bytes: int,
    records: int,
    ready: Any,
) -> Outcome:
    """One producer of the confluent-kafka system (runs in a child process)."""
    from confluent_kafka import Producer

    value = payload(value_bytes, index)
    out = Outcome(index, records)
    lat = out.latencies_s
    p = Producer({"bootstrap.servers": cfg["bootstrap"], **KAFKA_PRODUCER_SETTINGS})
    topic = cfg["topic"]

    def done(err: Any, _msg: Any) -> None:
        if err is None:
            out.acked += 1
        else:
            out.errors += 1
            out.error_sample = out.error_sample or str(err)

    def sampled(t: float) -> Callable[[Any, Any], None]:
        def cb(err: Any, msg: Any) -> None:
            lat.append(clock() - t)
            done(err, msg)

        return cb

    # Connect, fetch metadata and the producer id before the clock starts, as the SDK
    # producers take their lease before ready().
    p.list_topics(topic, timeout=60)
    ready()
    cpu0 = time.process_time()
    out.started = clock()
    produce, poll = p.produce, p.poll
    for j in range(records):
        cb = sampled(clock()) if j % LATENCY_EVERY == 0 else done
        while True:
            try:
                produce(topic, value, partition=0, on_delivery=cb)
                break
            except BufferError:
                poll(0.005)
        if j % KAFKA_POLL_EVERY == 0:
            poll(0)
    left = p.flush(600)
    out.finished = clock()
    out.client_cpu_s = time.process_time() - cpu0
    if left:
        out.errors += left
        out.error_sample = out.error_sample or f"{left} records never delivered"
    return out


def produce_aiokafka(
    cfg: dict[str, Any],
    index: int,
    phase: str,
    value_bytes: int,
    records: int,
    ready: Any,
) -> Outcome:
    """One producer of the aiokafka system (runs in a child process): ``send()`` without
    awaiting each record, so aiokafka batches as it can (its defaults: 16 KiB batches,
    linger 0, which an awaited-later send fills while the event loop is busy)."""
    import asyncio

    from aiokafka import AIOKafkaProducer

    value = payload(value_bytes, index)
    out = Outcome(index, records)
    lat = out.latencies_s

    async def run() -> None:
        p = AIOKafkaProducer(
            bootstrap_servers=cfg["bootstrap"],
            enable_idempotence=True,
            acks="all",
            linger_ms=5,
            max_batch_size=512 * 1024,
        )
        await p.start()
        try:
            await p.client.force_metadata_update()
            ready()
            cpu0 = time.process_time()
            out.started = clock()
            futs = []
            for j in range(records):
                t = clock() if j % LATENCY_EVERY == 0 else 0.0
                fut = await p.send(cfg["topic"], value, partition=0)
                if t:
                    fut.add_done_callback(lambda _f, t=t: lat.append(clock() - t))
                futs.append(fut)
            await p.flush()
            for r in await asyncio.gather(*futs, return_exceptions=True):
                if isinstance(r, BaseException):
                    out.errors += 1
                    out.error_sample = out.error_sample or repr(r)
                else:
                    out.acked += 1
            out.finished = clock()
            out.client_cpu_s = time.process_time() - cpu0
        finally:
            await p.stop()

    asyncio.run(run())
    return out


def _pass(
    system: Any, cfg: dict[str, Any], phase: str, args: argparse.Namespace, value_bytes: int
) -> tuple[PassResult, float, int]:
    watch = ProcWatch(system.server_pids())
    watch.start()
    outcomes = run_producers(
        system.producer,
        cfg,
        producers=args.producers,
        phase=phase,
        value_bytes=value_bytes,
        records=args.records,
    )
    usage = watch.stop()
    res = summarize(outcomes)
    print(
        f"  {system.key:22s} {value_bytes:>5} B {phase:8s} {res.records_per_s:>12,.0f} rec/s"
        f"  p50 {res.p50_ms:7.1f} ms  p99 {res.p99_ms:7.1f} ms  server CPU {usage.cpu_s:6.1f} s"
        f"  client CPU {res.client_cpu_s:6.1f} s"
        f"  acked {res.acked} dup {res.duplicates} err {res.errors}",
        flush=True,
    )
    if res.errors:
        print(f"    errors, e.g.: {res.error_sample}", flush=True)
    return res, usage.cpu_s, usage.peak_rss_bytes


def run_system(system: Any, args: argparse.Namespace) -> list[Row]:
    rows = []
    system.start()
    try:
        for value_bytes in args.sizes:
            cfg = system.prepare(value_bytes)
            prod, cpu, rss = _pass(system, cfg, "produce", args, value_bytes)
            row = Row(system.key, system.name, value_bytes, prod, cpu, rss)
            if system.dedup:
                row.resend, row.resend_cpu_s, _ = _pass(system, cfg, "resend", args, value_bytes)
            rows.append(row)
    finally:
        system.stop()
    return rows


def build(key: str, workdir: Path) -> Any:
    if key == "ceiling":
        return ceiling.System(workdir)
    if key == "pidlease":
        return pidlease_sdk.System(workdir)
    if key == "pidlease-batch":
        return BatchSystem(workdir)
    if key == "pidlease-r3":
        # Three partition servers, a topic with replication_factor 3: a batch is acked
        # once every in-sync replica holds it (fsynced); see docs/replication.md.
        return pidlease_sdk.System(workdir, replication_factor=3)
    if key in ("confluent-kafka", "aiokafka"):
        return KafkaSystem(workdir, key)
    if key == "nats":
        return nats_jetstream.System(workdir)
    if key.startswith("redis-"):
        return redis_streams.System(workdir, key.removeprefix("redis-"))
    raise ValueError(key)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.compare", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--records", type=int, default=100_000, help="records per producer")
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--sizes", default="100,1024", help="record value sizes in bytes")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--skip-alone", action="store_true", help="skip the pidlease-only figures")
    ap.add_argument(
        "--quick-alone",
        action="store_true",
        help="smaller pidlease-only figures (100k PIDs instead of 1M, fewer leases)",
    )
    ap.add_argument("--docs", default=str(ROOT / "docs" / "benchmarks.md"))
    ap.add_argument("--chart", default=str(ROOT / "docs" / "img" / "throughput.png"))
    ap.add_argument("--no-docs", action="store_true", help="print only")
    ap.add_argument("--json", help="also write every figure to this file")
    args = ap.parse_args(argv)
    args.sizes = [int(x) for x in args.sizes.split(",")]
    wanted = [s for s in args.systems.split(",") if s]
    command = ".venv/bin/python -m bench.compare " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    machine = report.machine_info()
    print(
        f"{machine['cpu']}, {machine['cores']} cores, load {machine['load_start']}; "
        f"{args.producers} producers x {args.records} records",
        flush=True,
    )
    started = time.time()
    rows: list[Row] = []
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="pidlease-compare-") as tmp:
        workdir = Path(tmp)
        for key in wanted:
            system = build(key, workdir)
            why = system.available() if hasattr(system, "available") else None
            if why:
                skipped[key] = f"not available: {why}"
                continue
            print(f"== {system.name}", flush=True)
            rows += run_system(system, args)
        alone: dict[str, Any] = {}
        if not args.skip_alone:
            alone = pidlease_alone.run(
                workdir, producers=args.producers, records=args.records, quick=args.quick_alone
            )
    machine["load_end"] = report.load_average()
    machine["minutes"] = round((time.time() - started) / 60, 1)
    text = report.render(rows, skipped, alone, machine, command, args)
    print(text)
    for size in args.sizes:
        one = {r.key: r for r in rows if r.value_bytes == size}
        send, batch = one.get("pidlease-r1-strict"), one.get("pidlease-r1-strict-batch")
        ceil = one.get("ceiling")
        if send is not None and batch is not None:
            b, s1 = batch.produce.records_per_s, send.produce.records_per_s
            line = f"send_batch / send ({size} B): {b:,.0f} / {s1:,.0f} rec/s = {b / s1:.2f}x"
            if ceil is not None:
                line += f"; send_batch / ceiling {b / ceil.produce.records_per_s:.2f}"
            print(line)
        base = [(k, one.get(k)) for k in ("ceiling", "pidlease-r1-strict")]
        for key in ("confluent-kafka", "aiokafka"):
            row = one.get(key)
            if row is None:
                continue
            rate = row.produce.records_per_s
            us = row.cpu_s / row.produce.records * 1e6 if row.produce.records else float("nan")
            ratios = "; ".join(
                f"/ {k} {rate / b.produce.records_per_s:.2f}" for k, b in base if b is not None
            )
            print(f"{key} ({size} B): {rate:,.0f} rec/s, {us:.2f} us server CPU/record; {ratios}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "rows": [asdict(r) for r in rows],
                    "skipped": skipped,
                    "alone": alone,
                    "machine": machine,
                },
                indent=1,
                default=str,
            )
        )
    if not args.no_docs:
        report.write_docs(Path(args.docs), text, Path(args.chart))
        report.chart(rows, Path(args.chart))
        print(f"wrote {args.docs} and {args.chart}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
