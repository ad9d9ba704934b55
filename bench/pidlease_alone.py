"""Figures only pidlease has, for ``bench/compare.py``: dedup overhead (strict vs off on
the same server, through the SDK and on the wire), the server's DUPLICATE path, leases
with one and two coordinators, replay rate at recovery, memory per tracked PID, and the
pause a producer sees when its partition's only replica is killed and restarted.

Each figure is measured independently; one that fails is reported as failed with its
reason, and the others still run. The older scripts do the work where they already can
(``bench_append.py`` for the wire overhead, ``bench_lease.py``, ``bench_recovery.py``).
"""

from __future__ import annotations

import json
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from bench.peers import pidlease_sdk
from bench.runner import run_producers
from bench.workload import summarize

ROOT = Path(__file__).resolve().parent.parent


def _guard(name: str, fn: Callable[[], Any]) -> Any:
    print(f"== pidlease alone: {name}", flush=True)
    try:
        result = fn()
    except Exception as exc:  # one figure failing must not lose the others
        print(f"   failed: {exc!r}", flush=True)
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    print(f"   {result}", flush=True)
    return result


# -- dedup overhead through the SDK --------------------------------------------------------
def sdk_dedup(system: pidlease_sdk.System, producers: int, records: int, rounds: int = 2
              ) -> dict[str, Any]:
    """Strict and off topics on the same server, alternated (strict, off, off, strict ...)
    so drift in the machine's load falls on both alike; medians."""
    rates: dict[str, list[float]] = {"strict": [], "off": []}
    for r in range(rounds):
        for mode in (("strict", "off") if r % 2 == 0 else ("off", "strict")):
            cfg = system.prepare(100, dedup=mode)
            res = summarize(run_producers(system.producer, cfg, producers=producers,
                                          phase="produce", value_bytes=100, records=records))
            if res.errors or res.acked != res.records:
                raise RuntimeError(f"{mode}: {res.errors} errors, {res.acked} of {res.records} "
                                   f"acked: {res.error_sample}")
            rates[mode].append(res.records_per_s)
    s, o = statistics.median(rates["strict"]), statistics.median(rates["off"])
    return {"strict_records_per_s": s, "off_records_per_s": o, "strict_over_off": s / o,
            "rounds": rounds}


# -- the wire: first pass and the DUPLICATE path ------------------------------------------
def wire_pass(address: str, topic: str, pid: int, generation: int, batches: int,
              records_per_batch: int, window: int = 8) -> tuple[float, Counter[int]]:
    """Send ``batches`` batches of 100-byte records from sequence 0 on one pipelined
    connection; (seconds, answers by error code)."""
    from bench.bench_append import FastBatches
    from partition_server.testing import token
    from pidlease import protocol as P
    from pidlease.devcluster import DEV_SECRET

    host, _, port = address.rpartition(":")
    fb = FastBatches(pid, generation, records_per_batch, 100)
    tok = token(DEV_SECRET, pid, generation)
    codes: Counter[int] = Counter()
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray()
    sent = got = 0
    t0 = time.perf_counter()
    try:
        while got < batches:
            out = []
            while sent < batches and sent - got < window:
                out.append(P.produce_request(sent + 1, topic, 0, tok,
                                             fb.make(sent * records_per_batch)))
                sent += 1
            if out:
                sock.sendall(b"".join(out))
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("partition server closed the connection")
            buf += chunk
            while len(buf) >= 4:
                (n,) = struct.unpack_from(">I", buf)
                if len(buf) < 4 + n:
                    break
                codes[struct.unpack_from(">H", buf, 8)[0]] += 1
                del buf[:4 + n]
                got += 1
    finally:
        sock.close()
    return time.perf_counter() - t0, codes


def wire_duplicates(system: pidlease_sdk.System, records: int) -> dict[str, Any]:
    assert system.cluster is not None
    cfg = system.prepare(100)
    address = system.cluster.servers[0].address
    per = 1000
    batches = max(1, records // per)
    pid, gen = 900_000_001, 1   # the server checks the token's HMAC, not the coordinator
    wire_pass(address, cfg["topic"], 0, 0, 1, 1)   # warm-up: the server learns the topic
    first_s, first = wire_pass(address, cfg["topic"], pid, gen, batches, per)
    again_s, again = wire_pass(address, cfg["topic"], pid, gen, batches, per)
    if first != Counter({0: batches}):
        raise RuntimeError(f"first pass answers by code: {dict(first)}")
    return {"records": batches * per, "duplicates": again.get(2, 0) * per,
            "other_answers": {k: v for k, v in again.items() if k != 2},
            "first_records_per_s": batches * per / first_s,
            "records_per_s": batches * per / again_s}


# -- restart pause -------------------------------------------------------------------------
def restart_pause(system: pidlease_sdk.System, records: int, kill_after_s: float = 1.5
                  ) -> dict[str, Any]:
    """A producer sends ``records``; ``kill_after_s`` in, the partition server is SIGKILLed
    and restarted. The pause is the longest gap between acknowledgements it sees."""
    from pidlease import Producer
    from pidlease.verify import verify_topic

    assert system.cluster is not None
    cfg = system.prepare(100)
    acks: list[float] = []
    state: dict[str, Any] = {}

    def producer() -> None:
        try:
            with Producer(cfg["url"], topic=cfg["topic"], producer_name="restart-pause") as p:
                futs = []
                for j in range(records):
                    f = p.send(b"x" * 100)
                    if j % 16 == 0:
                        f.add_done_callback(lambda _f: acks.append(time.monotonic()))
                    futs.append(f)
                p.flush()
            results = [f.result() for f in futs]
            state["acked"] = sum(not r.duplicate for r in results)
            state["duplicates"] = sum(r.duplicate for r in results)
        except Exception as exc:
            state["error"] = repr(exc)

    t = threading.Thread(target=producer, daemon=True)
    t.start()
    time.sleep(kill_after_s)
    svc = system.cluster.servers[0]
    t0 = time.monotonic()
    system.cluster.restart(svc)
    restart_s = time.monotonic() - t0
    t.join(300)
    if t.is_alive():
        raise TimeoutError("the producer did not finish within 300 s of the restart")
    if "error" in state:
        raise RuntimeError(state["error"])
    times = sorted(acks)
    gaps = [b - a for a, b in zip(times, times[1:])]
    audit = verify_topic(cfg["url"], cfg["topic"])
    return {"pause_s": max(gaps) if gaps else float("nan"), "restart_s": restart_s,
            "acked": state["acked"], "duplicates": state["duplicates"], "errors": 0,
            "audit": "ok" if audit.ok else audit.summary()}


# -- the older scripts ---------------------------------------------------------------------
def wire_dedup(batches: int) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_append.py"),
                           "--batches", str(batches), "--rounds", "3"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-300:] or proc.stdout[-300:])
    d = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"strict_records_per_s": d["strict_records_per_s"],
            "off_records_per_s": d["off_records_per_s"], "strict_over_off": d["strict_over_off"]}


def leases(count: int) -> list[dict[str, Any]]:
    """Throughput with 64 connections per coordinator (bench_lease.py's default: its
    latencies include queueing behind 63 others), and latency with one connection (one
    request at a time: the time a producer waits for its lease)."""
    from bench.bench_lease import run_setup

    rows = []
    for n in (1, 2):
        for connections, leases_n in ((64, count), (1, max(200, count // 10))):
            for r in run_setup(n, leases_n, connections, 100):
                rows.append({"connections": connections,
                             **{k: v for k, v in r.items() if k != "replies"}})
    return rows


def replay(quick: bool) -> list[dict[str, Any]]:
    from bench.bench_recovery import replay_rate

    out = []
    # The SDK's batches (1000 records of 100 B) and small batches of 10 records.
    for batches, per in ((500 if quick else 2000, 1000), (20_000 if quick else 100_000, 10)):
        r = replay_rate(batches, per, 1000)
        r["records_per_s"] = r["batches_per_s"] * per
        out.append(r)
    return out


def memory(quick: bool) -> list[dict[str, Any]]:
    from bench.bench_recovery import memory_per_pid

    n = 100_000 if quick else 1_000_000
    return [{"pids": n, "batches_kept": k, "bytes_per_pid": memory_per_pid(n, k)} for k in (1, 5)]


def run(workdir: Path, *, producers: int, records: int, quick: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    system = pidlease_sdk.System(workdir / "alone")
    system.start()
    try:
        out["dedup_sdk"] = _guard("dedup strict vs off, SDK",
                                  lambda: sdk_dedup(system, producers, records))
        out["wire_duplicates"] = _guard("DUPLICATE path on the wire",
                                        lambda: wire_duplicates(system, max(records, 100_000)))
        out["restart_pause"] = _guard("restart pause", lambda: restart_pause(system, 400_000))
    finally:
        system.stop()
    out["dedup_wire"] = _guard("dedup strict vs off, wire (bench_append.py)",
                               lambda: wire_dedup(200 if quick else 600))
    out["lease"] = _guard("lease_pid, 1 and 2 coordinators (bench_lease.py)",
                          lambda: leases(2000 if quick else 5000))
    out["replay"] = _guard("replay rate (bench_recovery.py)", lambda: replay(quick))
    out["memory"] = _guard("memory per tracked PID (bench_recovery.py)", lambda: memory(quick))
    for key in ("lease", "replay", "memory"):
        if isinstance(out[key], dict):   # failed: keep the reason, tables expect lists
            out[f"{key}_failed"] = out.pop(key)
    return out
