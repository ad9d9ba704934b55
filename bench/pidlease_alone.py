"""Figures only pidlease has, for ``bench/compare.py``: dedup overhead (strict vs off on
the same server, through the SDK and on the wire), the server's DUPLICATE path, leases
with one and two coordinators, replay rate at recovery, memory per tracked PID, and the
pause a producer sees when its partition's only replica is killed and restarted.

Each figure is measured independently; one that fails is reported as failed with its
reason, and the others still run. The older scripts do the work where they already can
(``bench_lease.py``, ``bench_recovery.py``).
"""

from __future__ import annotations

import itertools
import socket
import statistics
import struct
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.peers import pidlease_sdk
from bench.procstats import ProcWatch
from bench.runner import run_producers
from bench.workload import summarize


def _guard(name: str, fn: Callable[[], Any]) -> Any:
    print(f"== pidlease alone: {name}", flush=True)
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - one figure failing must not lose the others
        print(f"   failed: {exc!r}", flush=True)
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    print(f"   {result}", flush=True)
    return result


# -- dedup overhead: strict vs off on the same server ---------------------------------------
def _alternate(rounds: int, one: Callable[[str], tuple[float, float]]) -> dict[str, Any]:
    """Run ``one(mode)`` -> (records/s, server CPU us per record) for strict and off,
    alternating which goes first each round so drift in the machine's load falls on both
    alike. The overhead is read from server CPU per record (what dedup costs the server);
    throughput on a shared machine swings by more than the effect being measured."""
    got: dict[str, list[tuple[float, float]]] = {"strict": [], "off": []}
    for r in range(rounds):
        for mode in ("strict", "off") if r % 2 == 0 else ("off", "strict"):
            got[mode].append(one(mode))
    med = {
        m: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v))
        for m, v in got.items()
    }
    return {
        "strict_records_per_s": med["strict"][0],
        "off_records_per_s": med["off"][0],
        "strict_over_off": med["strict"][0] / med["off"][0],
        "strict_cpu_us_per_record": med["strict"][1],
        "off_cpu_us_per_record": med["off"][1],
        "cpu_overhead_pct": (med["strict"][1] / med["off"][1] - 1) * 100,
        "rounds": rounds,
    }


def sdk_dedup(
    system: pidlease_sdk.System, producers: int, records: int, rounds: int = 4
) -> dict[str, Any]:
    """Producers through the SDK into a strict and an off topic of the same server."""

    def one(mode: str) -> tuple[float, float]:
        cfg = system.prepare(100, dedup=mode)
        watch = ProcWatch(system.server_pids())
        watch.start()
        res = summarize(
            run_producers(
                system.producer,
                cfg,
                producers=producers,
                phase="produce",
                value_bytes=100,
                records=records,
            )
        )
        cpu = watch.stop().cpu_s
        if res.errors or res.acked != res.records:
            raise RuntimeError(
                f"{mode}: {res.errors} errors, {res.acked} of {res.records} "
                f"acked: {res.error_sample}"
            )
        return res.records_per_s, cpu / res.records * 1e6

    return _alternate(rounds, one)


def wire_dedup(system: pidlease_sdk.System, records: int, rounds: int = 6) -> dict[str, Any]:
    """One pipelining client on the wire (100 B records in batches of 1,000, the SDK's
    batches without the SDK) into a strict and an off topic of the same server: the
    server's own cost of the append rules. (``bench_append.py`` measures the same on its
    own cluster, by throughput only.)"""
    assert system.cluster is not None
    address = system.cluster.servers[0].address
    batches = max(1, records // 1000)
    pid = [900_100_000]

    def one(mode: str) -> tuple[float, float]:
        cfg = system.prepare(100, dedup=mode)
        wire_pass(address, cfg["topic"], 0, 0, 1, 1)  # warm-up: the server learns the topic
        pid[0] += 1
        watch = ProcWatch(system.server_pids())
        watch.start()
        secs, codes = wire_pass(address, cfg["topic"], pid[0], 1, batches, 1000)
        cpu = watch.stop().cpu_s
        if codes != Counter({0: batches}):
            raise RuntimeError(f"{mode}: answers by code {dict(codes)}")
        return batches * 1000 / secs, cpu / (batches * 1000) * 1e6

    return _alternate(rounds, one)


def dedup_rules_cost(batches: int = 200_000, pids: int = 2) -> dict[str, Any]:
    """What the append rules themselves cost per batch, measured in-process with no I/O:
    ``check_append`` + ``apply_append`` for every batch and ``mark_durable`` every 8
    batches (a group commit), as the partition does for a strict topic. This is the work
    dedup adds; the end-to-end CPU ratios above carry more noise than this effect."""
    from partition_server.producer_state import ProducerStateTable

    t = ProducerStateTable(mode="strict", batches_kept=5, pids_max=1_000_000)
    seqs = [0] * pids
    offset = 0
    t0 = time.process_time()
    for i in range(batches):
        pid = 1 + i % pids
        t.check_append(pid, 1, seqs[pid - 1], 1000)
        t.apply_append(pid, 1, seqs[pid - 1], 1000, offset, 1_700_000_000_000)
        seqs[pid - 1] += 1000
        offset += 1000
        if i % 8 == 7:
            t.mark_durable(offset)
    us = (time.process_time() - t0) / batches * 1e6
    return {"us_per_batch": us, "us_per_record_at_1000": us / 1000, "batches": batches}


# -- the wire: first pass and the DUPLICATE path ------------------------------------------
def wire_pass(
    address: str,
    topic: str,
    pid: int,
    generation: int,
    batches: int,
    records_per_batch: int,
    window: int = 8,
) -> tuple[float, Counter[int]]:
    """Send ``batches`` batches of 100-byte records from sequence 0 on one pipelined
    connection; (seconds, answers by error code)."""
    from bench.bench_append import FastBatches
    from pidlease.testing.devcluster import DEV_SECRET
    from pidlease.testing.wire import token
    from pidlease.wire import protocol as P

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
                out.append(
                    P.produce_request(sent + 1, topic, 0, tok, fb.make(sent * records_per_batch))
                )
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
                del buf[: 4 + n]
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
    pid, gen = 900_000_001, 1  # the server checks the token's HMAC, not the coordinator
    wire_pass(address, cfg["topic"], 0, 0, 1, 1)  # warm-up: the server learns the topic
    first_s, first = wire_pass(address, cfg["topic"], pid, gen, batches, per)
    again_s, again = wire_pass(address, cfg["topic"], pid, gen, batches, per)
    if first != Counter({0: batches}):
        raise RuntimeError(f"first pass answers by code: {dict(first)}")
    return {
        "records": batches * per,
        "duplicates": again.get(2, 0) * per,
        "other_answers": {k: v for k, v in again.items() if k != 2},
        "first_records_per_s": batches * per / first_s,
        "records_per_s": batches * per / again_s,
    }


# -- restart pause -------------------------------------------------------------------------
def restart_pause(
    system: pidlease_sdk.System, records: int, kill_after_s: float = 1.5
) -> dict[str, Any]:
    """A producer sends ``records``; ``kill_after_s`` in, the partition server is SIGKILLed
    and restarted. The pause is the longest gap between acknowledgements it sees."""
    from pidlease import Producer
    from pidlease.cli.verify import verify_topic

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
        except Exception as exc:  # noqa: BLE001 - reported by the main thread
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
    gaps = [b - a for a, b in itertools.pairwise(times)]
    audit = verify_topic(cfg["url"], cfg["topic"])
    return {
        "pause_s": max(gaps) if gaps else float("nan"),
        "restart_s": restart_s,
        "acked": state["acked"],
        "duplicates": state["duplicates"],
        "errors": 0,
        "audit": "ok" if audit.ok else audit.summary(),
    }


# -- the older scripts ---------------------------------------------------------------------
def leases(count: int) -> list[dict[str, Any]]:
    """Throughput with 64 connections per coordinator (bench_lease.py's default: its
    latencies include queueing behind 63 others), and latency with one connection (one
    request at a time: the time a producer waits for its lease)."""
    from bench.bench_lease import run_setup

    rows = []
    for n in (1, 2):
        for connections, leases_n in ((64, count), (1, max(200, count // 10))):
            for r in run_setup(n, leases_n, connections, 100):
                rows.append(
                    {"connections": connections, **{k: v for k, v in r.items() if k != "replies"}}
                )
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
        # Enough records per round that the server's CPU per record is read to about 1 %.
        out["dedup_sdk"] = _guard(
            "dedup strict vs off, SDK", lambda: sdk_dedup(system, producers, max(records, 250_000))
        )
        out["dedup_wire"] = _guard(
            "dedup strict vs off, wire", lambda: wire_dedup(system, 1_000_000)
        )
        out["dedup_rules"] = _guard("the append rules' own cost", dedup_rules_cost)
        out["wire_duplicates"] = _guard(
            "DUPLICATE path on the wire", lambda: wire_duplicates(system, max(records, 100_000))
        )
        out["restart_pause"] = _guard("restart pause", lambda: restart_pause(system, 400_000))
    finally:
        system.stop()
    out["lease"] = _guard(
        "lease_pid, 1 and 2 coordinators (bench_lease.py)", lambda: leases(2000 if quick else 5000)
    )
    # replay_rate() leaves its log in a mkdtemp() directory: make that one ours.
    tempfile.tempdir = str(workdir)
    try:
        out["replay"] = _guard("replay rate (bench_recovery.py)", lambda: replay(quick))
    finally:
        tempfile.tempdir = None
    out["memory"] = _guard("memory per tracked PID (bench_recovery.py)", lambda: memory(quick))
    for key in ("lease", "replay", "memory"):
        if isinstance(out[key], dict):  # failed: keep the reason, tables expect lists
            out[f"{key}_failed"] = out.pop(key)
    return out
