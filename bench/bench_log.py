"""The log's life, measured (issue 13 "Must show"): real servers, real files.

disk     A topic with retention_bytes 64 MiB and 4 MiB segments at R=3 (3 partition
         servers + 1 coordinator), 1 GiB produced into it. A sampler thread measures the
         disk use (allocated blocks, like ``du``) of each replica's ``<data_dir>/<topic>-0``
         directory every ``--sample-ms`` during the run and while retention settles after
         it; the max per replica is compared with 64 MiB + two segments. Then every record
         from ``log_start_offset`` on is read back with ``pidlease.Reader(start="earliest")``:
         offsets contiguous, count = HW - log start, each value's sequence one more than
         the last.
restart  One partition server, one partition, R=1, no coordinator (a lease token signed
         with the dev secret). A ~30 MiB and a ~3 GiB log filled with big batches, a
         snapshot let cover each; then SIGKILL, start again, and time until a produce of
         the producer holding the lease is answered (and the server's own recovery time).
         3 times per size: median and the ratio big/small.
fetch    On the same two logs: N FETCHes at uniformly random offsets below the high
         watermark over one connection: p50/p99 per log and the ratio.

The two sizes run in the same process one after the other (same machine load), so the
ratio is the figure to read. Data lives in a temp dir that is removed at the end.

    python bench/bench_log.py [--quick] [--part disk|restart|fetch] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pidlease.client.reader import Reader
from pidlease.testing.devcluster import DEV_SECRET, LocalCluster, Service
from pidlease.testing.wire import WireClient, create_topic, token
from pidlease.wire import protocol as P

MiB = 1024 * 1024
GiB = 1024 * MiB
_SEQ = struct.Struct(">Q")


# -- common --------------------------------------------------------------------------------
def dir_usage(path: Path) -> tuple[int, int]:
    """(allocated bytes of every file, as ``du`` counts them; apparent bytes of the
    ``*.log`` segment files). Files retention unlinks mid-scan are skipped."""
    blocks = seg = 0
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        return 0, 0
    for e in entries:
        try:
            st = e.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        blocks += st.st_blocks * 512
        if e.name.endswith(".log"):
            seg += st.st_size
    return blocks, seg


class Sampler:
    """Samples ``dir_usage`` of each directory every ``interval_s`` on a thread; keeps
    the max per directory."""

    def __init__(self, dirs: dict[str, Path], interval_s: float) -> None:
        self.dirs = dirs
        self.interval_s = interval_s
        self.max_du = dict.fromkeys(dirs, 0)
        self.max_seg = dict.fromkeys(dirs, 0)
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, d in self.dirs.items():
                du, seg = dir_usage(d)
                self.max_du[name] = max(self.max_du[name], du)
                self.max_seg[name] = max(self.max_seg[name], seg)
            self.samples += 1
            self._stop.wait(self.interval_s)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def values_for(first_seq: int, count: int, value_bytes: int) -> list[tuple[bytes | None, bytes]]:
    """Records whose value starts with their own sequence number (checked on read-back)."""
    pad = b"v" * (value_bytes - _SEQ.size)
    return [(None, _SEQ.pack(first_seq + i) + pad) for i in range(count)]


def produce_stream(
    address: str,
    topic: str,
    *,
    pid: int,
    tok: str,
    first_seq: int,
    total_bytes: int,
    value_bytes: int,
    per_batch: int,
    window: int,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Pipelined produces of ``per_batch`` records of ``value_bytes`` until ``total_bytes``
    of values went in; every answer must be a success. Returns the next sequence."""
    batch_bytes = per_batch * value_bytes
    batches = max(1, total_bytes // batch_bytes)
    pad = b"v" * (value_bytes - _SEQ.size)
    sent = done = 0
    seq = first_seq
    with WireClient(address, timeout_s=120) as c:
        while done < batches:
            while sent < batches and sent - done < window:
                recs = [(None, _SEQ.pack(seq + i) + pad) for i in range(per_batch)]
                b = P.encode_batch(
                    recs,
                    pid=pid,
                    generation=1,
                    base_sequence=seq,
                    timestamp_ms=int(time.time() * 1000),
                )
                c.produce_send(topic, 0, b, tok)
                seq += per_batch
                sent += 1
            r = c.recv()
            if r.error_code != 0:
                raise RuntimeError(f"produce failed: {r.error_code} {r.detail}")
            done += 1
            if progress is not None:
                progress(done * batch_bytes)
    return seq


def progress_printer(label: str, total: int) -> Callable[[int], None]:
    t0 = time.perf_counter()
    step = max(total // 10, 1)
    nxt = [step]

    def show(n: int) -> None:
        if n >= nxt[0]:
            nxt[0] += step
            s = time.perf_counter() - t0
            print(
                f"    {label}: {n / MiB:,.0f} MiB of {total / MiB:,.0f} in {s:.1f}s "
                f"({n / MiB / max(s, 1e-9):.0f} MiB/s)",
                flush=True,
            )

    return show


def partition_entry(address: str, topic: str) -> dict[str, Any] | None:
    try:
        with WireClient(address, timeout_s=10) as c:
            md = c.metadata()
    except OSError:
        return None
    return next((p for p in md["partitions"] if p["topic"] == topic), None)


def wait_until(
    pred: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.1
) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval_s)
    raise TimeoutError(f"{what} within {timeout_s}s")


def produce_one(address: str, topic: str, pid: int, tok: str, seq: int) -> P.Response:
    with WireClient(address, timeout_s=10) as c:
        b = P.encode_batch(
            values_for(seq, 1, 64),
            pid=pid,
            generation=1,
            base_sequence=seq,
            timestamp_ms=int(time.time() * 1000),
        )
        return c.produce(topic, 0, b, tok)


# -- disk: the retention_bytes bound at R=3 ------------------------------------------------
def part_disk(base: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    retention, segment, total = cfg["retention_bytes"], cfg["segment_bytes"], cfg["produce_bytes"]
    bound = retention + 2 * segment
    env = {
        "PIDLEASE_RETENTION_CHECK_MS": str(cfg["retention_check_ms"]),
        "PIDLEASE_SNAPSHOT_INTERVAL_MS": str(cfg["snapshot_interval_ms"]),
    }
    print(
        f"disk: R=3, retention_bytes {retention / MiB:g} MiB, segment_bytes "
        f"{segment / MiB:g} MiB, {total / MiB:,.0f} MiB produced; bound {bound / MiB:g} MiB; "
        f"server env {env}",
        flush=True,
    )
    topic = "disk"
    with LocalCluster(base / "disk", servers=3, coordinators=1, env=env) as cluster:
        cluster.create_topic(
            topic, 1, 3, retention_bytes=retention, segment_bytes=segment, retention_ms=-1
        )

        def leader() -> Service | None:
            for svc in cluster.servers:
                e = partition_entry(svc.address, topic)
                if e is not None and e["role"] == "leader":
                    return svc
            return None

        lead = wait_until(leader, 60, "a leader for the topic", 0.2)
        pid, tok = 900_001, token(DEV_SECRET, 900_001, 1)
        wait_until(
            lambda: produce_one(lead.address, topic, pid, tok, 0).error_code == 0,
            60,
            "the leader to take a produce",
            0.2,
        )
        dirs = {
            f"server-{s.ident}{' (leader)' if s is lead else ''}": cluster.data_dir
            / f"server-{s.ident}"
            / "data"
            / f"{topic}-0"
            for s in cluster.servers
        }
        t0 = time.perf_counter()
        with Sampler(dirs, cfg["sample_ms"] / 1000) as sampler:
            produce_stream(
                lead.address,
                topic,
                pid=pid,
                tok=tok,
                first_seq=1,
                total_bytes=total,
                value_bytes=cfg["value_bytes"],
                per_batch=cfg["per_batch"],
                window=cfg["window"],
                progress=progress_printer("produced", total),
            )
            produce_s = time.perf_counter() - t0

            # Keep sampling while the followers catch up and retention settles.
            def settled() -> list[dict[str, Any]] | None:
                es = [partition_entry(s.address, topic) for s in cluster.servers]
                if any(e is None for e in es):
                    return None
                hw = max(e["high_watermark"] for e in es if e is not None)
                ok = all(
                    e is not None
                    and e["log_end_offset"] >= hw
                    and e["log_start_offset"] > 0
                    and dir_usage(d)[1] <= retention + segment
                    for e, d in zip(es, dirs.values(), strict=True)
                )
                return [e for e in es if e is not None] if ok else None

            try:
                entries = wait_until(settled, 60, "retention to settle on every replica", 0.5)
            except TimeoutError as exc:
                print(f"  ! {exc}")
                entries = [partition_entry(s.address, topic) or {} for s in cluster.servers]
            time.sleep(2 * cfg["sample_ms"] / 1000)
        final = {name: dir_usage(d) for name, d in dirs.items()}

        print("  reading back from the log start (Reader, start='earliest') ...", flush=True)
        t1 = time.perf_counter()
        lead_entry = partition_entry(lead.address, topic) or {}
        start, hw = lead_entry["log_start_offset"], lead_entry["high_watermark"]
        n, last_off, last_seq, errors = 0, start - 1, None, []
        with Reader(cluster.coordinator_url, topic, 0, start="earliest") as reader:
            for rec in reader:
                if rec.offset != last_off + 1:
                    errors.append(f"offset {rec.offset} after {last_off}")
                seq = _SEQ.unpack_from(rec.value)[0]
                if last_seq is not None and seq != last_seq + 1:
                    errors.append(f"sequence {seq} after {last_seq} at offset {rec.offset}")
                last_off, last_seq = rec.offset, seq
                n += 1
                if len(errors) > 10:
                    break
        read_s = time.perf_counter() - t1
        if n != hw - start:
            errors.append(f"read {n} records, HW - log start = {hw} - {start} = {hw - start}")
    rows = []
    for name, e in zip(dirs, entries, strict=True):
        rows.append(
            {
                "replica": name,
                "max_du_mib": round(sampler.max_du[name] / MiB, 2),
                "max_segments_mib": round(sampler.max_seg[name] / MiB, 2),
                "final_du_mib": round(final[name][0] / MiB, 2),
                "log_start_offset": e.get("log_start_offset"),
                "high_watermark": e.get("high_watermark"),
                "under_bound": sampler.max_du[name] <= bound,
            }
        )
        print(
            f"  {name:>20}: max du {rows[-1]['max_du_mib']:7.2f} MiB (segments "
            f"{rows[-1]['max_segments_mib']:.2f}), after {rows[-1]['final_du_mib']:.2f} MiB, "
            f"log start {e.get('log_start_offset')}, HW {e.get('high_watermark')}: "
            f"{'under' if rows[-1]['under_bound'] else 'OVER'} {bound / MiB:g} MiB"
        )
    print(
        f"  produced {total / MiB:,.0f} MiB in {produce_s:.1f}s ({total / MiB / produce_s:.0f} "
        f"MiB/s), {sampler.samples} samples; read back {n} records [{start}, {hw}) in "
        f"{read_s:.1f}s: {'in order, contiguous' if not errors else 'ERRORS ' + str(errors)}",
        flush=True,
    )
    return {
        "retention_bytes": retention,
        "segment_bytes": segment,
        "produced_bytes": total,
        "bound_bytes": bound,
        "server_env": env,
        "produce_s": round(produce_s, 2),
        "samples": sampler.samples,
        "sample_ms": cfg["sample_ms"],
        "replicas": rows,
        "read_back": {"records": n, "log_start": start, "high_watermark": hw, "errors": errors},
        "ok": not errors and all(r["under_bound"] for r in rows),
    }


# -- restart and fetch: one server, a small and a big log ----------------------------------
def restart_once(
    cluster: LocalCluster, svc: Service, topic: str, pid: int, tok: str, seq: int
) -> dict[str, float]:
    cluster.kill(svc)
    t0 = time.perf_counter()
    cluster.start_service(svc, timeout_s=600)
    listen_s = time.perf_counter() - t0

    def answered() -> bool:
        try:
            return produce_one(svc.address, topic, pid, tok, seq).error_code == 0
        except OSError:
            return False

    wait_until(answered, 600, "a produce answered after the restart", 0.02)
    total_s = time.perf_counter() - t0
    rec = partition_entry_recovery(svc.address)
    return {"to_produce_s": round(total_s, 3), "to_listen_s": round(listen_s, 3), **rec}


def index_note(r: dict[str, float]) -> str:
    if "segments_from_index" not in r:
        return ""
    return (
        f"; segments from index {r['segments_from_index']}, scanned "
        f"{r['segments_scanned']}, indexes rebuilt {r['indexes_rebuilt']}"
    )


def partition_entry_recovery(address: str) -> dict[str, float]:
    with WireClient(address) as c:
        r = c.metadata().get("recovery") or {}
    out = {
        "server_recovery_s": r.get("seconds", -1),
        "batches_replayed": r.get("batches_replayed", -1),
        "log_batches": r.get("batches", -1),
    }
    # Reported by servers with segment indexes: how much of the log was read at open.
    for k in ("segments_from_index", "segments_scanned", "indexes_rebuilt", "bytes"):
        if k in r:
            out[k] = r[k]
    return out


def fetch_latencies(
    address: str, topic: str, n: int, max_bytes: int, rng: random.Random
) -> dict[str, Any]:
    lat = []
    with WireClient(address, timeout_s=60) as c:
        hw = c.fetch(topic, 0, 0, 1024).high_watermark
        for _ in range(n):
            off = rng.randrange(hw)
            t0 = time.perf_counter()
            r = c.fetch(topic, 0, off, max_bytes)
            lat.append(time.perf_counter() - t0)
            if r.error_code != 0 or r.data is None or not len(r.data):
                raise RuntimeError(f"fetch at {off}: {r.error_code} {r.detail}")
            h, _ = next(iter(P.iter_batches(r.data)))
            if not h.base_offset <= off <= h.last_offset:
                raise RuntimeError(
                    f"fetch at {off} returned batch {h.base_offset}..{h.last_offset}"
                )
    lat.sort()
    return {
        "n": n,
        "p50_ms": round(statistics.median(lat) * 1000, 3),
        "p99_ms": round(lat[min(n - 1, int(n * 0.99))] * 1000, 3),
        "max_ms": round(lat[-1] * 1000, 3),
    }


def one_log(
    base: Path, label: str, size: int, cfg: dict[str, Any], parts: set[str]
) -> dict[str, Any]:
    env = {
        "PIDLEASE_SNAPSHOT_INTERVAL_MS": str(cfg["snapshot_interval_ms"]),
        "PIDLEASE_SNAPSHOT_INTERVAL_BATCHES": str(cfg["snapshot_interval_batches"]),
    }
    topic = "log"
    out: dict[str, Any] = {"label": label, "target_bytes": size}
    with LocalCluster(base / label, servers=1, coordinators=0, env=env) as cluster:
        svc = cluster.servers[0]
        create_topic(cluster.zk_hosts, topic)
        pid, tok = 900_002, token(DEV_SECRET, 900_002, 1)
        wait_until(
            lambda: produce_one(svc.address, topic, pid, tok, 0).error_code == 0,
            60,
            "the server to take a produce",
            0.2,
        )
        t0 = time.perf_counter()
        seq = produce_stream(
            svc.address,
            topic,
            pid=pid,
            tok=tok,
            first_seq=1,
            total_bytes=size,
            value_bytes=cfg["value_bytes"],
            per_batch=cfg["per_batch"],
            window=cfg["window"],
            progress=progress_printer(f"{label} fill", size),
        )
        out["fill_s"] = round(time.perf_counter() - t0, 1)
        # A snapshot covering the whole log (the same for both sizes): what is measured is
        # the cost of opening the log, not of replaying a tail of different length.
        time.sleep(cfg["snapshot_interval_ms"] / 1000 + 1.0)
        e = partition_entry(svc.address, topic) or {}
        pdir = cluster.data_dir / f"server-{svc.ident}" / "data" / f"{topic}-0"
        out["log_bytes"] = e.get("size_bytes", dir_usage(pdir)[1])
        out["high_watermark"] = e.get("high_watermark")
        out["segments"] = len(list(pdir.glob("*.log")))
        print(
            f"  {label}: {out['log_bytes'] / MiB:,.1f} MiB, {out['segments']} segments, HW "
            f"{out['high_watermark']}, filled in {out['fill_s']}s",
            flush=True,
        )
        if "restart" in parts:
            runs = []
            for i in range(cfg["repeats"]):
                r = restart_once(cluster, svc, topic, pid, tok, seq)
                seq += 1
                runs.append(r)
                print(
                    f"    restart {i + 1}: produce answered {r['to_produce_s']:.3f}s after start "
                    f"(listening {r['to_listen_s']:.3f}s; server recovery "
                    f"{r['server_recovery_s']}s, replayed {r['batches_replayed']} of "
                    f"{r['log_batches']} batches{index_note(r)})",
                    flush=True,
                )
            out["restarts"] = runs
            out["restart_median_s"] = statistics.median(r["to_produce_s"] for r in runs)
        if "fetch" in parts:
            f = fetch_latencies(
                svc.address, topic, cfg["fetches"], cfg["fetch_bytes"], random.Random(13)
            )
            out["fetch"] = f
            print(
                f"    {f['n']} random-offset fetches: p50 {f['p50_ms']} ms, p99 {f['p99_ms']} ms",
                flush=True,
            )
    shutil.rmtree(base / label, ignore_errors=True)
    return out


def part_logs(base: Path, cfg: dict[str, Any], parts: set[str]) -> dict[str, Any]:
    print(
        f"{' and '.join(sorted(parts))}: 1 partition server, 1 partition, R=1; batches of "
        f"{cfg['per_batch']} x {cfg['value_bytes']} B; snapshot every "
        f"{cfg['snapshot_interval_ms']} ms / {cfg['snapshot_interval_batches']} batches",
        flush=True,
    )
    small = one_log(base, "small", cfg["small_bytes"], cfg, parts)
    big = one_log(base, "big", cfg["big_bytes"], cfg, parts)
    res: dict[str, Any] = {"small": small, "big": big, "config": cfg}
    if "restart" in parts:
        res["restart_ratio"] = round(big["restart_median_s"] / small["restart_median_s"], 2)
        print(
            f"  restart to first produce, median of {cfg['repeats']}: big "
            f"{big['restart_median_s']:.3f}s / small {small['restart_median_s']:.3f}s = "
            f"{res['restart_ratio']}x"
        )
    if "fetch" in parts:
        res["fetch_p50_ratio"] = round(big["fetch"]["p50_ms"] / small["fetch"]["p50_ms"], 2)
        res["fetch_p99_ratio"] = round(big["fetch"]["p99_ms"] / small["fetch"]["p99_ms"], 2)
        print(
            f"  random-offset fetch: p50 ratio {res['fetch_p50_ratio']}x, p99 ratio "
            f"{res['fetch_p99_ratio']}x (big / small)"
        )
    return res


# -- main ----------------------------------------------------------------------------------
FULL: dict[str, Any] = {
    "disk": {
        "retention_bytes": 64 * MiB,
        "segment_bytes": 4 * MiB,
        "produce_bytes": 1 * GiB,
        # The servers' defaults: retention also runs when a segment rolls and when the
        # snapshot a deletion waits for is written (LogManager.retention_soon), so the bound
        # no longer needs a short timer (before that: 20 ms / 50 ms, docs/benchmarks.md).
        "retention_check_ms": 30_000,
        "snapshot_interval_ms": 30_000,
        "sample_ms": 250,
        "value_bytes": 16 * 1024,
        "per_batch": 16,
        "window": 8,
    },
    "logs": {
        "small_bytes": 30 * MiB,
        "big_bytes": 3 * GiB,
        "value_bytes": 64 * 1024,
        "per_batch": 12,
        "window": 8,
        "snapshot_interval_ms": 2000,
        "snapshot_interval_batches": 10_000,
        "repeats": 3,
        "fetches": 200,
        "fetch_bytes": 1 * MiB,
    },
}
SMALL_BATCHES: dict[str, Any] = {"value_bytes": 1000, "per_batch": 1, "window": 256}
QUICK: dict[str, Any] = {
    "disk": {
        **FULL["disk"],
        # The full run's segments: the bound's slack (two segments) is what tolerates
        # the deletion's delay at the produce rate, so smaller ones would not pass.
        "retention_bytes": 16 * MiB,
        "produce_bytes": 160 * MiB,
    },
    "logs": {**FULL["logs"], "small_bytes": 3 * MiB, "big_bytes": 96 * MiB, "fetches": 50},
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    ap.add_argument("--part", choices=["disk", "restart", "fetch"], action="append")
    ap.add_argument(
        "--small-batches",
        action="store_true",
        help="restart/fetch with ~1 KiB batches (many batches per GiB)",
    )
    ap.add_argument("--small-bytes", type=float, help="MiB of the small log (override)")
    ap.add_argument("--big-bytes", type=float, help="MiB of the big log (override)")
    ap.add_argument("--retention-check-ms", type=int, help="disk: the servers' retention_check_ms")
    ap.add_argument("--snapshot-ms", type=int, help="disk: the servers' snapshot_interval_ms")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    cfg = json.loads(json.dumps(QUICK if args.quick else FULL))
    if args.small_batches:
        cfg["logs"].update(SMALL_BATCHES)
    if args.retention_check_ms:
        cfg["disk"]["retention_check_ms"] = args.retention_check_ms
    if args.snapshot_ms:
        cfg["disk"]["snapshot_interval_ms"] = args.snapshot_ms
    if args.small_bytes:
        cfg["logs"]["small_bytes"] = int(args.small_bytes * MiB)
    if args.big_bytes:
        cfg["logs"]["big_bytes"] = int(args.big_bytes * MiB)
    parts = set(args.part or ["disk", "restart", "fetch"])
    results: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    base = Path(tempfile.mkdtemp(prefix="pidlease-bench-log-"))
    try:
        if "disk" in parts:
            results["disk"] = part_disk(base, cfg["disk"])
        if parts & {"restart", "fetch"}:
            results["logs"] = part_logs(base, cfg["logs"], parts & {"restart", "fetch"})
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
        print(f"figures written to {args.json}")
    return 0 if results.get("disk", {}).get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
