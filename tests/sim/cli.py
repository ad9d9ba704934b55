"""``python -m tests.sim``: run many seeds, or replay one.

    python -m tests.sim run --seeds 2000 [--start N] [--minutes M] [--stop-on-failure]
                            [--retention] [--kafka | --no-kafka] [--zk3 | --no-zk3]
    python -m tests.sim replay 12345 [-v] [--retention] [--kafka | --no-kafka] [--zk3 | --no-zk3]
    python -m tests.sim teeth [--only NAME...] [--short] [--jobs N]  # tests/sim/teeth

``--retention``: some topics get small segments and a short retention (by age, by size),
and the servers apply it every few ms of virtual time (off by default: see README).

``--kafka``: Kafka idempotent producers (kproducer.py: Kafka's wire protocol, SASL,
InitProducerId) in every seed; by default some seeds have them, chosen by the seed.

``--zk3``: a 3-server ZooKeeper ensemble in every seed, one member cut off from the quorum
at times, serving stale reads to its sessions until it notices (zk.py).

``run`` prints, at the end and every ~10 s: seeds run, seeds per minute, faults and
invariant checks per run, and every failing seed with the command that replays it.
``replay`` runs one seed again (the same seed gives the same run) and prints its plan,
its failures and, with -v, the trace of events (server log lines included)."""

from __future__ import annotations

import argparse
import sys
import time

from tests.sim.world import Result, run_seed


def _flag(name: str, on: bool | None) -> str:
    return f" --{name}" if on else f" --no-{name}" if on is False else ""


def replay_command(
    seed: int, retention: bool = False, kafka: bool | None = None, zk3: bool | None = None
) -> str:
    return (
        f"python -m tests.sim replay {seed} -v{' --retention' if retention else ''}"
        f"{_flag('kafka', kafka)}{_flag('zk3', zk3)}"
    )


def describe_failure(
    r: Result, retention: bool = False, kafka: bool | None = None, zk3: bool | None = None
) -> str:
    lines = [
        f"seed {r.seed} FAILED ({len(r.failures)} problem(s)); replay: "
        f"{replay_command(r.seed, retention, kafka, zk3)}"
    ]
    lines += [f"  - {f}" for f in r.failures[:8]]
    if len(r.failures) > 8:
        lines.append(f"  ... and {len(r.failures) - 8} more")
    return "\n".join(lines)


KINDS = (  # (kind, words that identify it in a failure message), first match wins
    ("harness", ("harness error", "unhandled error", "stalled")),
    ("order", ("applied out of order", "answers in order")),
    ("durability", ("above what is fsynced",)),
    ("ack-offset", ("is not in the log at that offset",)),
    ("lost-ack", ("is not in the log", "acked records but")),
    ("lease", ("its lease outlived the session",)),
    ("takeover", ("a takeover started below the acked highwater",)),
    ("duplicate", ("in the log ",)),
    ("fenced-write", ("after the fence",)),
    ("sequence", ("not in sequence order", "a gap on a strict topic", "stored with sequence")),
    ("replicas", ("differ below the high watermark", "replicas differ")),
    ("retention", ("log start went back", "above the high watermark", "below the log start")),
    ("producer-failed", ("failed: ",)),
    ("stuck", ("stuck", "did not come back")),
)


def kind_of(failure: str) -> str:
    for kind, words in KINDS:
        if any(w in failure for w in words):
            return kind
    return "other"


class Totals:
    def __init__(self) -> None:
        self.runs = 0
        self.failed: list[int] = []
        self.faults = 0
        self.checks = 0
        self.acked = 0
        self.kafka_acked = 0
        self.deleted = 0
        self.kinds: dict[str, list[int]] = {}
        self.t0 = time.perf_counter()

    def add(self, r: Result) -> None:
        self.runs += 1
        self.faults += sum(r.faults.values())
        self.checks += r.checks
        self.acked += r.acked
        self.kafka_acked += r.kafka_acked
        self.deleted += r.segments_deleted
        if not r.ok:
            self.failed.append(r.seed)
            for k in sorted({kind_of(f) for f in r.failures}):
                self.kinds.setdefault(k, []).append(r.seed)

    def line(self) -> str:
        secs = time.perf_counter() - self.t0
        n = max(self.runs, 1)
        return (
            f"{self.runs} seeds in {secs:.1f}s ({self.runs / max(secs, 1e-9) * 60:.0f} seeds/min), "
            f"{self.faults / n:.1f} faults/run, {self.checks / n:.0f} invariant checks/run, "
            f"{self.acked / n:.0f} acked records/run ({self.kafka_acked / n:.0f} by Kafka), "
            + (f"{self.deleted / n:.1f} segments deleted/run, " if self.deleted else "")
            + f"{len(self.failed)} failed"
        )


def run_many(
    seeds: int,
    start: int,
    minutes: float | None,
    stop_on_failure: bool,
    out: object = sys.stdout,
    *,
    retention: bool = False,
    kafka: bool | None = None,
    zk3: bool | None = None,
) -> Totals:
    tot = Totals()
    deadline = None if minutes is None else time.perf_counter() + minutes * 60
    last_report = time.perf_counter()
    for seed in range(start, start + seeds):
        if deadline is not None and time.perf_counter() >= deadline:
            break
        r = run_seed(seed, retention=retention, kafka=kafka, zk3=zk3)
        tot.add(r)
        if not r.ok:
            print(describe_failure(r, retention, kafka, zk3), file=out, flush=True)  # type: ignore[call-overload]
            if stop_on_failure:
                break
        if time.perf_counter() - last_report > 10:
            last_report = time.perf_counter()
            print(tot.line(), file=out, flush=True)  # type: ignore[call-overload]
    print(tot.line(), file=out, flush=True)  # type: ignore[call-overload]
    if tot.failed:
        print("failing seeds: " + " ".join(map(str, tot.failed)), file=out)  # type: ignore[call-overload]
        for k, hit in sorted(tot.kinds.items(), key=lambda kv: kv[1][0]):
            print(
                f"  {k}: {len(hit)} seeds, first {hit[0]} (seeds run to find it: "
                f"{hit[0] - start + 1}); e.g. {' '.join(map(str, hit[:10]))}",
                file=out,
            )  # type: ignore[call-overload]
    return tot


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["teeth"]:  # the catalogue of reintroduced bugs: its own arguments
        from tests.sim.teeth.runner import main as teeth_main

        return teeth_main(argv[1:])
    ap = argparse.ArgumentParser(
        prog="python -m tests.sim",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run many seeds")
    run.add_argument("--seeds", type=int, default=1000)
    run.add_argument("--start", type=int, default=0)
    run.add_argument("--minutes", type=float, default=None)
    run.add_argument("--stop-on-failure", action="store_true")
    run.add_argument("--retention", action="store_true", help="topics with short retention")
    rep = sub.add_parser("replay", help="run one seed again")
    rep.add_argument("seed", type=int)
    rep.add_argument("-v", "--verbose", action="store_true", help="print the trace of events")
    rep.add_argument("--retention", action="store_true", help="topics with short retention")
    for p in (run, rep):
        for name, what in (
            ("kafka", "Kafka producers"),
            ("zk3", "a 3-server ZooKeeper, a member cut off from the quorum"),
        ):
            k = p.add_mutually_exclusive_group()
            k.add_argument(
                f"--{name}",
                dest=name,
                action="store_const",
                const=True,
                default=None,
                help=f"{what} in every seed (default: in some seeds, by the seed)",
            )
            k.add_argument(
                f"--no-{name}", dest=name, action="store_const", const=False, help="in no seed"
            )
    sub.add_parser("teeth", help="reintroduce each catalogued bug, run its search (--help)")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        tot = run_many(
            args.seeds,
            args.start,
            args.minutes,
            args.stop_on_failure,
            retention=args.retention,
            kafka=args.kafka,
            zk3=args.zk3,
        )
        return 1 if tot.failed else 0
    r = run_seed(
        args.seed, verbose=args.verbose, retention=args.retention, kafka=args.kafka, zk3=args.zk3
    )
    print(f"seed {r.seed}: plan {r.plan}")
    if args.verbose:
        print("\n".join(r.trace))
    print(
        f"seed {r.seed}: {'ok' if r.ok else 'FAILED'}; faults {r.faults}, {r.checks} invariant "
        f"checks, {r.batches} batches, {r.acked} acked records ({r.kafka_acked} by Kafka), "
        f"{r.segments_deleted} "
        f"segments deleted, {r.virtual_s:.3f}s virtual, "
        f"{r.wall_s:.3f}s wall"
    )
    if not r.ok:
        print(describe_failure(r, args.retention, args.kafka, args.zk3))
    return 0 if r.ok else 1
