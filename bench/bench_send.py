"""``Producer.send()`` throughput, old code against new, in the same run: the client's cost.

    PYTHONPATH=. python -m bench.bench_send [--records 300000] [--reps 5] [--old-rev fceb23d]

Each measurement is a fresh subprocess: one blocking ``Producer`` sends ``--records``
values of ``--value-bytes`` bytes (no key, round robin over ``--partitions``), then
``flush()``; records/s = records / (time of the sends + the flush), and the process's CPU
time (both threads) per record over the same span, which other load on the machine
disturbs less than the wall clock. The producer talks to
an in-process sink, not a server: the coordinator is an ``httpx.MockTransport`` and
``LeaderPool.connection_for`` returns a fake connection that answers every produce
request on the next loop iteration. What is measured is the SDK alone (both of its
threads), without a server competing for the two cores.

Six variants, interleaved in every repetition so drift hits them alike:

- ``old``            ``--old-rev`` (default fceb23d, before the engine was untangled),
                     extracted with ``git archive`` into a temporary directory and put
                     first on the child's PYTHONPATH
- ``new-fast``       this tree
- ``new-readable``   this tree with ``PIDLEASE_SDK_READABLE_PATH=1`` (every send through
                     the owning classes' plain methods; see pidlease/client/producer.py)
- ``new-batch``      this tree, the records handed over by ``send_batch`` in calls of
                     ``--batch-call`` records (a list of bytes) instead of one ``send``
                     each ("send() us/record" is then the calls' time per record)
- ``old-readable``, ``old-batch``: the same two on ``--old-rev``, so each new variant is
                     compared with its own old one
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "bench"


# -- the child: one measurement ---------------------------------------------------------
class _SinkConnection:
    """Answers each produce request NONE on the next loop iteration, with offsets."""

    closed = False

    def __init__(self) -> None:
        self._corr = itertools.count(1)
        self._next_offset = 0

    def next_correlation_id(self) -> int:
        return next(self._corr)

    def send(
        self, api_key: int, correlation_id: int, data: bytes, *, timeout_ms: int | None = None
    ) -> asyncio.Future[Any]:
        from pidlease import errors
        from pidlease.wire import protocol

        req = protocol.decode_request(memoryview(data)[4:])  # [:4]: the frame length
        assert req.batch is not None
        count = protocol.decode_batch_header(req.batch).count
        base = self._next_offset
        self._next_offset += count
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        answer = protocol.Response(
            correlation_id, errors.NONE, "", base_offset=base, last_offset=base + count - 1
        )
        fut.get_loop().call_soon(fut.set_result, answer)
        return fut

    def abort(self, reason: str = "") -> None:
        pass

    async def close(self) -> None:
        pass


def _coordinator(partitions: int) -> Any:
    import httpx

    def lease(body: dict[str, Any]) -> dict[str, Any]:
        return {
            "error": "NONE",
            "pid": 1000,
            "generation": 1,
            "sequence_number": 0,
            "expire_ms": 600_000,
            "expires_at_ms": 0,
            "lease_token": "tok",
        }

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        if request.url.path.startswith("/v1/topics/"):
            return httpx.Response(
                200,
                json={
                    "error": "NONE",
                    "name": TOPIC,
                    "partitions": partitions,
                    "replication_factor": 1,
                    "dedup": "strict",
                    "partition_states": [
                        {
                            "partition": p,
                            "leader": 1,
                            "leader_address": "sink:1",
                            "leader_epoch": 0,
                            "replicas": [1],
                            "isr": [1],
                            "log_end_offset": 0,
                            "high_watermark": 0,
                        }
                        for p in range(partitions)
                    ],
                },
            )
        if request.url.path == "/v1/lease_pid":
            return httpx.Response(200, json=lease(body))
        return httpx.Response(
            200, json={"error": "NONE", "responses": [lease(r) for r in body["requests"]]}
        )

    return httpx.MockTransport(handle)


def child(records: int, value_bytes: int, partitions: int) -> None:
    from pidlease.client import leader_pool
    from pidlease.client.producer import Producer

    sink = _SinkConnection()

    async def connection_for(self: Any, partition: int) -> Any:
        return sink

    leader_pool.LeaderPool.connection_for = connection_for  # type: ignore[method-assign]
    value = b"v" * value_bytes
    with Producer("http://sink", topic=TOPIC, http_transport=_coordinator(partitions)) as p:
        for _ in range(2000):  # warm up: first batches, caches, the loop thread
            p.send(value)
        p.flush()
        send = p.send
        per_call = int(os.environ.get("BENCH_SEND_BATCH", "0"))
        t0, c0, s0 = time.perf_counter(), time.process_time(), time.thread_time()
        if per_call:  # the new-batch variant: send_batch calls of per_call records
            for start in range(0, records, per_call):
                p.send_batch([value] * min(per_call, records - start))
        else:
            for _ in range(records):
                send(value)
        send_cpu = time.thread_time() - s0
        p.flush()
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        last = send(value).result(10)
    assert last.offset == records + 2000, last  # every record reached the sink once
    print(
        json.dumps(
            {
                "records_per_s": records / elapsed,
                "cpu_us": cpu / records * 1e6,
                "send_us": send_cpu / records * 1e6,
            }
        )
    )


# -- the parent: old and new side by side ------------------------------------------------
def _old_tree(rev: str, into: Path) -> Path:
    """``rev``'s pidlease/ package, extracted with git archive (no work tree needed)."""
    tar = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", rev, "pidlease"],
        check=True,
        capture_output=True,
    ).stdout
    tar_path = into / "old.tar"
    tar_path.write_bytes(tar)
    with tarfile.open(tar_path) as tf:
        tf.extractall(into, filter="data")
    return into


# each new variant against its own old one (and send_batch against the old send)
RATIOS = (
    ("new-fast", "old"),
    ("new-readable", "old-readable"),
    ("new-batch", "old-batch"),
    ("new-batch", "old"),
)
METRICS = {"records_per_s": "records/s", "cpu_us": "CPU us/record", "send_us": "send() us/record"}


def _measure(
    pythonpath: Path, readable: bool, args: argparse.Namespace, batch_call: int = 0
) -> dict[str, float]:
    env = dict(
        os.environ,
        PYTHONPATH=f"{pythonpath}{os.pathsep}{ROOT}",
        PIDLEASE_SDK_READABLE_PATH="1" if readable else "0",
        BENCH_SEND_BATCH=str(batch_call),
    )
    out = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            "--records",
            str(args.records),
            "--value-bytes",
            str(args.value_bytes),
            "--partitions",
            str(args.partitions),
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=str(pythonpath),
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return {k: float(got[k]) for k in METRICS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--old-rev", default="fceb23d")
    ap.add_argument("--batch-call", type=int, default=10_000, help="records per send_batch")
    ap.add_argument("--only", default="", help="comma-separated variants (default: all)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.records, args.value_bytes, args.partitions)
        return
    names: tuple[str, ...] = (
        "old",
        "new-fast",
        "old-readable",
        "new-readable",
        "old-batch",
        "new-batch",
    )
    got: dict[str, dict[str, list[float]]] = {n: {m: [] for m in METRICS} for n in names}
    with tempfile.TemporaryDirectory(prefix="pidlease-bench-send-") as tmp:
        old = _old_tree(args.old_rev, Path(tmp))
        runs = {
            "old": (old, False, 0),
            "new-fast": (ROOT, False, 0),
            "old-readable": (old, True, 0),
            "new-readable": (ROOT, True, 0),
            "old-batch": (old, False, args.batch_call),
            "new-batch": (ROOT, False, args.batch_call),
        }
        if args.only:
            runs = {n: r for n, r in runs.items() if n in args.only.split(",")}
            names = tuple(runs)
        for rep in range(args.reps):
            line = []
            for name, (path, readable, batch_call) in runs.items():
                m = _measure(path, readable, args, batch_call)
                for k, v in m.items():
                    got[name][k].append(v)
                line.append(
                    f"{name} {m['records_per_s'] / 1000:6.0f}k/s {m['cpu_us']:.2f}us "
                    f"send {m['send_us']:.2f}us"
                )
            print(f"rep {rep + 1}/{args.reps}: " + " | ".join(line), flush=True)
    print(
        f"\n{args.records} records of {args.value_bytes} B, {args.partitions} partitions, "
        f"{args.reps} reps; median [min-max]"
    )
    med = {n: {k: statistics.median(v) for k, v in got[n].items()} for n in names}
    for k, label in METRICS.items():
        print(f"  {label}:")
        for n in names:
            vals = got[n][k]
            fmt = "{:,.0f}" if k == "records_per_s" else "{:.3f}"
            print(
                f"    {n:13s} {fmt.format(med[n][k]):>10s}  "
                f"[{fmt.format(min(vals))} - {fmt.format(max(vals))}]"
            )
        for new, base in (r for r in RATIOS if set(r) <= set(names)):
            print(f"    {new + ' / ' + base:26s} {med[new][k] / med[base][k]:.3f}")


if __name__ == "__main__":
    main()
