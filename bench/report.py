"""The comparison's output: the markdown table (printed and written into the generated
section of ``docs/benchmarks.md``), the throughput goals checked against this run's
figures, and the throughput chart (``docs/img/throughput.png``)."""

from __future__ import annotations

import math
import os
import platform
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.workload import PassResult

BEGIN = "<!-- bench.compare: generated section, begin -->"
END = "<!-- bench.compare: generated section, end -->"


@dataclass
class Row:
    key: str
    name: str
    value_bytes: int
    produce: PassResult
    cpu_s: float
    peak_rss_bytes: int
    resend: PassResult | None = None
    resend_cpu_s: float = 0.0


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _version(cmd: list[str]) -> str:
    try:
        return (
            subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
            .stdout.strip()
            .splitlines()[0]
        )
    except (OSError, IndexError, subprocess.SubprocessError):
        return "not installed"


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "nats": _version(["nats-server", "--version"]),
        "redis": _version(["redis-server", "--version"]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_start": load_average(),
    }


def _f(x: float, digits: int = 0) -> str:
    return "n/a" if math.isnan(x) else f"{x:,.{digits}f}"


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def _find(rows: list[Row], key: str, size: int) -> Row | None:
    return next((r for r in rows if r.key == key and r.value_bytes == size), None)


def comparison_tables(rows: list[Row], skipped: dict[str, str], sizes: list[int]) -> list[str]:
    out = []
    for size in sizes:
        ceil = _find(rows, "ceiling", size)
        out += [
            f"\n#### Records of {size} bytes\n",
            (
                "| system | records/s | x ceiling | p50 ack ms | p99 ack ms | server CPU s "
                "(us/record) | server peak RSS MB | resend records/s | resend recognised as "
                "duplicates |"
            ),
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for r in (r for r in rows if r.value_bytes == size):
            p = r.produce
            frac = _f(_ratio(p.records_per_s, ceil.produce.records_per_s), 2) if ceil else "n/a"
            us = r.cpu_s / p.records * 1e6 if p.records else float("nan")
            if r.resend is None:
                # A Kafka client's idempotence covers its own retries only: no resend pass is
                # run for it, though the server keeps its producer state.
                kafka = "kafka" in r.name
                rs = "n/a"
                dup = "n/a (produce pass only)" if kafka else "n/a (keeps no producer state)"
            else:
                rs = _f(r.resend.records_per_s)
                dup = f"{r.resend.duplicates:,} of {r.resend.records:,}"
                if r.resend.errors:
                    dup += f" ({r.resend.errors:,} errors)"
            errs = f" ({p.errors:,} errors!)" if p.errors else ""
            out.append(
                f"| {r.name}{errs} | {_f(p.records_per_s)} | {frac} | {_f(p.p50_ms, 1)} "
                f"| {_f(p.p99_ms, 1)} | {r.cpu_s:.1f} ({us:.1f}) | "
                f"{r.peak_rss_bytes / 2**20:,.0f} | {rs} | {dup} |"
            )
        for key, why in skipped.items():
            label = "pidlease R=3 strict (SDK send)" if key == "pidlease-r3" else key
            out.append(f"| {label} | {why} | | | | | | | |")
    return out


def goals(rows: list[Row], alone: dict[str, Any]) -> list[str]:
    """Issue 7's goals against this run: (goal, measured, verdict) rows."""
    out = ["| goal | target | measured | verdict |", "| --- | --- | --- | --- |"]

    def add(goal: str, target: str, value: float, need: float, higher: bool, fmt: str) -> None:
        if math.isnan(value):
            out.append(f"| {goal} | {target} | not measured | - |")
            return
        ok = value >= need if higher else value <= need
        by = value / need if higher else need / value if value else float("inf")
        verdict = "met" if ok else f"missed: reached {by:.2f} of the target"
        out.append(f"| {goal} | {target} | {fmt.format(value)} | {verdict} |")

    pl, ce = _find(rows, "pidlease-r1-strict", 100), _find(rows, "ceiling", 100)
    rf, na = _find(rows, "redis-function", 100), _find(rows, "nats", 100)
    pr = pl.produce.records_per_s if pl else float("nan")
    add(
        "pidlease R=1 strict / ceiling (100 B, SDK send)",
        ">= 0.5",
        _ratio(pr, ce.produce.records_per_s) if ce else float("nan"),
        0.5,
        True,
        "{:.3f}",
    )
    add(
        "pidlease / Redis function (100 B)",
        ">= 25x",
        _ratio(pr, rf.produce.records_per_s) if rf else float("nan"),
        25,
        True,
        "{:.1f}x",
    )
    add(
        "pidlease / NATS JetStream (100 B)",
        ">= 30x",
        _ratio(pr, na.produce.records_per_s) if na else float("nan"),
        30,
        True,
        "{:.1f}x",
    )
    rules, wire = alone.get("dedup_rules", {}), alone.get("dedup_wire", {})
    if "us_per_batch" in rules and "off_cpu_us_per_record" in wire:
        # The rules' own CPU per 1000-record batch over the server's whole CPU per batch
        # with dedup off: the overhead strict adds, without the run-to-run noise.
        add(
            "dedup overhead: append rules' CPU / server CPU per 1000-record batch (off)",
            "<= 3 %",
            rules["us_per_batch"] / (wire["off_cpu_us_per_record"] * 1000) * 100,
            3,
            False,
            "{:.2f} %",
        )
    for label, key in (("SDK", "dedup_sdk"), ("wire", "dedup_wire")):
        d = alone.get(key, {})
        add(
            f"dedup overhead end to end, server CPU per record strict vs off ({label}; noisy)",
            "<= 3 %",
            d.get("cpu_overhead_pct", float("nan")),
            3,
            False,
            "{:+.1f} %",
        )
    mem = [m for m in alone.get("memory", []) if m.get("pids") == 1_000_000]
    for m in mem:
        add(
            f"server memory per tracked PID, 1M PIDs, {m['batches_kept']} batch(es) kept",
            "<= 200 B",
            m["bytes_per_pid"],
            200,
            False,
            "{:.0f} B",
        )
    for row in alone.get("lease", []):
        n, kind, conns = row["coordinators"], row["kind"], row.get("connections", 64)
        if conns == 1:
            add(
                f"lease p99 ({kind}), {n} coordinator(s), one request at a time",
                "<= 10 ms",
                row["p99_ms"],
                10,
                False,
                "{:.1f} ms",
            )
        else:
            add(
                f"leases/s per coordinator ({kind}), {n} coordinator(s), {conns} connections each",
                ">= 2,000",
                row["leases_per_s"] / n,
                2000,
                True,
                "{:,.0f}",
            )
    for rp in alone.get("replay", []):
        add(
            f"replay at recovery ({rp['records_per_batch']} records/batch)",
            ">= 2,000,000/s",
            rp["records_per_s"],
            2_000_000,
            True,
            "{:,.0f}/s",
        )
    return out


def alone_tables(alone: dict[str, Any]) -> list[str]:
    out = []
    if "dedup_sdk" in alone or "dedup_wire" in alone:
        out += [
            "\n#### Dedup overhead: strict vs off on the same server\n",
            (
                "Alternating rounds, medians. The overhead is read from the partition server's "
                "CPU per record; throughput on a shared machine swings by more than the effect.\n"
            ),
            (
                "| path | strict records/s | off records/s | strict / off | strict server CPU "
                "us/record | off server CPU us/record | CPU overhead |"
            ),
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for label, key in (
            ("SDK send(), 100 B", "dedup_sdk"),
            ("wire, one pipelining client, 100 B x 1000", "dedup_wire"),
        ):
            d = alone.get(key)
            if d and "error" not in d:
                out.append(
                    f"| {label} ({d['rounds']} rounds) | {_f(d['strict_records_per_s'])} | "
                    f"{_f(d['off_records_per_s'])} | {d['strict_over_off']:.3f} | "
                    f"{d['strict_cpu_us_per_record']:.2f} | {d['off_cpu_us_per_record']:.2f} | "
                    f"{d['cpu_overhead_pct']:+.1f} % |"
                )
            elif d:
                out.append(f"| {label} | failed: {d['error']} | | | | | |")
    dr = alone.get("dedup_rules")
    if dr and "error" not in dr:
        out += [
            "",
            (
                f"The append rules themselves (check, apply, group-commit bookkeeping; "
                f"in-process, no I/O) cost **{dr['us_per_batch']:.1f} us per batch** "
                f"({dr['us_per_record_at_1000'] * 1000:.1f} ns per record in batches of "
                f"1,000)."
            ),
        ]
    wd = alone.get("wire_duplicates")
    if wd and "error" not in wd:
        out += [
            "\n#### The server's DUPLICATE path (same batches resent on the wire, same lease)\n",
            (
                f"{wd['duplicates']:,} of {wd['records']:,} records answered DUPLICATE, "
                f"{_f(wd['records_per_s'])} records/s (first pass: {_f(wd['first_records_per_s'])} "
                f"records/s)."
            ),
        ]
    if alone.get("lease"):
        out += [
            "\n#### lease_pid (bench_lease.py: standalone ZooKeeper, one partition server)\n",
            (
                "| kind | coordinators | connections each | leases/s | per coordinator | p50 ms "
                "| p99 ms |"
            ),
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in alone["lease"]:
            out.append(
                f"| {r['kind']} | {r['coordinators']} | {r.get('connections', 64)} | "
                f"{_f(r['leases_per_s'])} | "
                f"{_f(r['leases_per_s'] / r['coordinators'])} | {r['p50_ms']:.1f} | "
                f"{r['p99_ms']:.1f} |"
            )
    if alone.get("replay"):
        out += [
            "\n#### Replay at recovery (no snapshot: every batch checksummed and replayed)\n",
            "| records/batch | batches | log MB | seconds | records/s | MB/s |",
            "| ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in alone["replay"]:
            out.append(
                f"| {r['records_per_batch']} | {r['batches']:,} | {r['log_mb']} | "
                f"{r['seconds']} | {_f(r['records_per_s'])} | {r['mb_per_s']} |"
            )
    if alone.get("memory"):
        out += [
            "\n#### Server memory per tracked PID (tracemalloc over the producer-state table)\n",
            "| PIDs | batches kept per PID | bytes/PID |",
            "| ---: | ---: | ---: |",
        ]
        for m in alone["memory"]:
            out.append(f"| {m['pids']:,} | {m['batches_kept']} | {m['bytes_per_pid']:,.0f} |")
    rp = alone.get("restart_pause")
    if rp and "error" not in rp:
        out += [
            "\n#### Failover pause (R=1: the only replica SIGKILLed and restarted)\n",
            (
                f"Longest gap between acknowledgements seen by a producer: "
                f"**{rp['pause_s']:.2f} s** "
                f"(restart to listening: {rp['restart_s']:.2f} s). {rp['acked']:,} records acked, "
                f"{rp['duplicates']:,} resolved as duplicates (resends), "
                f"{rp['errors']} errors, audit: {rp['audit']}."
            ),
        ]
    for key, val in alone.items():
        if isinstance(val, dict) and "error" in val and key not in ("dedup_sdk", "dedup_wire"):
            out.append(f"\n{key}: failed: {val['error']}")
    return out


def render(
    rows: list[Row],
    skipped: dict[str, str],
    alone: dict[str, Any],
    machine: dict[str, Any],
    command: str,
    args: Any,
) -> str:
    m = machine
    lines = [
        BEGIN,
        "",
        "## Side by side (generated by `bench/compare.py`)",
        "",
        (
            f"Run {m['date']} on {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, "
            f"Linux {m['kernel']}, Python {m['python']}, {m['nats']}, {m['redis']}. "
            f"Load average at start {m['load_start']}, at end {m.get('load_end', '?')} "
            f"(a shared machine: other work ran at the same time); {m.get('minutes', '?')} minutes."
        ),
        "",
        "```",
        command,
        "```",
        "",
        (
            f"Workload: {args.producers} producers (separate processes) "
            f"x {args.records:,} records, "
            "every one acknowledged; then the same records again, which must all be recognised as "
            "duplicates. Ack latency: from handing a record to the client library to seeing its "
            "acknowledgement (every 64th record). Server CPU and peak RSS: the server process(es) "
            "during pass 1 (pidlease: the partition server; R=3: the three partition servers "
            "together)."
        ),
        "",
        (
            "Durability differs: pidlease acks after fsync (group commit; R=3: after every "
            "in-sync replica has fetched and fsynced the batch); NATS JetStream acks "
            "before its file store is fsynced; Redis acks before the append-only file's "
            "once-a-second fsync; the ceiling never fsyncs."
        ),
    ]
    lines += comparison_tables(rows, skipped, args.sizes)
    lines += ["", "### Throughput goals, this run", "", *goals(rows, alone)]
    if alone:
        lines += ["", "### pidlease alone", *alone_tables(alone)]
    lines += ["", "![throughput by system](img/throughput.png)", "", END]
    return "\n".join(lines)


def write_docs(path: Path, generated: str, chart_path: Path) -> None:
    """Replace the generated section of ``path`` (or append it), keeping everything else
    that people wrote there."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if BEGIN in text and END in text:
        head, _, rest = text.partition(BEGIN)
        _, _, tail = rest.partition(END)
        text = head + generated + tail
    else:
        text = text.rstrip("\n") + "\n\n" + generated + "\n"
    path.write_text(text)


def chart(rows: list[Row], path: Path) -> None:
    import matplotlib as mpl

    mpl.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r.value_bytes for r in rows})
    names = list(dict.fromkeys(r.name for r in rows))
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(names) * len(sizes) + 1.5))
    y: float = 0.0
    labels: list[str] = []
    ticks: list[float] = []
    colors = ["#4c72b0", "#dd8452", "#55a868", "#c44e52"]
    for name in names:
        for k, size in enumerate(sizes):
            r = next((x for x in rows if x.name == name and x.value_bytes == size), None)
            if r is None:
                continue
            v = r.produce.records_per_s
            ax.barh(
                y,
                v,
                color=colors[k % len(colors)],
                label=f"{size} B records" if name == names[0] else None,
            )
            ax.text(v, y, f" {v:,.0f}", va="center", fontsize=8)
            ticks.append(y)
            labels.append(f"{name} ({size} B)")
            y += 1
        y += 0.6
    ax.set_yticks(ticks, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("records/s acknowledged (log scale)")
    ax.set_title("Throughput by system, one run on one machine (bench/compare.py)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
