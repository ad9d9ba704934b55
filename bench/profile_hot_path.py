"""Profile the hot path: one producer's ``send()`` loop (the SDK, both of its threads)
and the partition server's produce path, at the same time, with py-spy.

    .venv/bin/python -m bench.profile_hot_path [--records 300000] [--value-bytes 100] [--wire]

Starts a local cluster (ZooKeeper, coordinator, one partition server), runs one producer
process under ``py-spy record`` and attaches a second py-spy to the partition server, then
prints, for each, the functions with the most samples on the stack (inclusive) and on top
(self). The raw collapsed stacks stay in the work directory for flame graphs. Use
``--pyinstrument`` to profile the producer with pyinstrument instead (one thread: the
caller's; the loop thread is not sampled).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from pidlease.testing.devcluster import LocalCluster

PY_SPY = str(Path(sys.executable).with_name("py-spy"))

ROOT = Path(__file__).resolve().parent.parent


def producer(url: str, topic: str, n: int, size: int) -> None:
    """The profiled program: ``n`` sends of ``size`` bytes, then flush."""
    from pidlease import Producer

    v = b"v" * size
    with Producer(url, topic=topic) as p:
        t0 = time.perf_counter()
        futs = [p.send(v) for _ in range(n)]
        p.flush()
        dt = time.perf_counter() - t0
    bad = sum(1 for f in futs if f.exception() is not None)
    print(f"{n / dt:,.0f} records/s ({dt:.2f} s), {bad} failed")


def summarize(raw: Path, top: int) -> str:
    """Inclusive and self sample counts per function from py-spy's collapsed stacks."""
    incl: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [
            f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1] + ")"
            for f in stack.split(";")
            if f
        ]
        for f in set(frames):
            incl[f] += n
        if frames:
            own[frames[-1]] += n
    lines = [f"{total} samples", "  inclusive:"]
    lines += [f"    {100 * c / total:5.1f}%  {f}" for f, c in incl.most_common(top)]
    lines += ["  self:"]
    lines += [f"    {100 * c / total:5.1f}%  {f}" for f, c in own.most_common(top)]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--pyinstrument", action="store_true")
    ap.add_argument(
        "--wire",
        action="store_true",
        help="drive the server with a raw pipelining client instead of the SDK "
        "(profiles the server's produce path at its own limit)",
    )
    ap.add_argument("--keep", help="directory for the raw profiles (default: a temporary one)")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        url, topic, n, size = args.child
        producer(url, topic, int(n), int(size))
        return 0
    work = Path(args.keep or tempfile.mkdtemp(prefix="pidlease-profile-"))
    work.mkdir(parents=True, exist_ok=True)
    with LocalCluster(work / "cluster", servers=1, coordinators=1) as cluster:
        cluster.create_topic("profile", 1)
        prod_args = [
            "-m",
            "bench.profile_hot_path",
            "--child",
            cluster.coordinator_url,
            "profile",
            str(args.records),
            str(args.value_bytes),
        ]
        if args.pyinstrument:
            cmd = [
                sys.executable,
                "-m",
                "pyinstrument",
                "-o",
                str(work / "producer.txt"),
                *prod_args,
            ]
        else:
            cmd = [
                PY_SPY,
                "record",
                "--threads",
                "--gil",
                "--format",
                "raw",
                "--rate",
                "250",
                "-o",
                str(work / "producer.raw"),
                "--",
                sys.executable,
                *prod_args,
            ]
        server_pid = cluster.servers[0].proc.pid  # type: ignore[union-attr]
        spy = subprocess.Popen(
            [
                PY_SPY,
                "record",
                "--format",
                "raw",
                "--rate",
                "250",
                "-o",
                str(work / "server.raw"),
                "--pid",
                str(server_pid),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # py-spy attaches
        if args.wire:
            from bench.pidlease_alone import wire_pass

            address = cluster.servers[0].address
            wire_pass(address, "profile", 0, 0, 1, 1)  # the server learns the topic
            batches = max(1, args.records // 1000)
            secs, codes = wire_pass(address, "profile", 900_000_001, 1, batches, 1000)
            rate = (
                f"{batches * 1000 / secs:,.0f} records/s on the wire ({secs:.2f} s), "
                f"answers {dict(codes)}"
            )
            out = subprocess.CompletedProcess([], 0, rate, "")
        else:
            out = subprocess.run(
                cmd, capture_output=True, text=True, timeout=900, cwd=ROOT, check=False
            )
        spy.send_signal(signal.SIGINT)
        spy.wait(30)
    rate = [ln for ln in out.stdout.splitlines() if "records/s" in ln]
    print(rate[0] if rate else out.stdout[-2000:] + out.stderr[-2000:])
    if args.wire:
        pass
    elif args.pyinstrument:
        print((work / "producer.txt").read_text())
    else:
        print("== producer (both threads)\n" + summarize(work / "producer.raw", args.top))
    if (work / "server.raw").exists():
        print(
            "== partition server (whole run, idle included)\n"
            + summarize(work / "server.raw", args.top)
        )
    print(f"raw profiles in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
