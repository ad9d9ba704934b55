"""The one command: pidlease side by side with NATS JetStream, Redis Streams and a bare
Python append server (the ceiling), plus the figures only pidlease has.

    /work/venv/bin/python -m bench.compare --records 200000 --producers 2

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
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import pidlease_alone, report
from bench.peers import ceiling, nats_jetstream, pidlease_sdk, redis_streams
from bench.procstats import ProcWatch
from bench.report import Row
from bench.runner import run_producers
from bench.workload import PassResult, summarize

ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = ("ceiling", "pidlease", "pidlease-r3", "nats", "redis-function", "redis-xadd")


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
    if key == "pidlease-r3":
        # Three partition servers, a topic with replication_factor 3: a batch is acked
        # once every in-sync replica holds it (fsynced); see docs/replication.md.
        return pidlease_sdk.System(workdir, replication_factor=3)
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
    command = "/work/venv/bin/python -m bench.compare " + " ".join(
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
