"""Draw what many partitions cost against P, from one or more ``--json`` outputs of
``bench/bench_partitions.py``: four panels, P on a log axis (issue 24 item 5).

- first write to all (s): constructing the producers until a record on every partition
  is acked;
- idle CPU per server (%): the mean of the three servers, the bar from the least to the
  most busy one;
- failover, last ack (s): the last of the SIGKILLed leader's partitions acked again,
  after the kill;
- controlled shutdown, last ack (s): the same after a SIGTERM (a handover).

Each input file is one series per topic count (``--topics``): a run of one topic and a run
of N topics per P come out as separate lines. A P that has no figure for a measure (its
run stopped with an error before it, or the measure was skipped) has no point there.

    python bench/plot_partitions.py --json before.json after.json [--labels before,after]
        [--note "2 shared cores, load 3"] [--out docs/img/partitions.png]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# (the key in bench_partitions' results, the panel's title)
MEASURES = [
    ("first_write_all_s", "first write to all (s)"),
    ("idle_cpu_pct", "idle CPU per server (%): mean, bar min-max"),
    ("failover_last_ack_s", "SIGKILL: last ack after the kill (s)"),
    ("shutdown_last_ack_s", "SIGTERM: last ack after the signal (s)"),
]


class InputError(ValueError):
    """An input file that is not bench_partitions' ``--json`` output."""


@dataclass
class Point:
    partitions: int
    value: float
    low: float
    high: float


@dataclass
class Series:
    label: str
    rows: list[dict[str, Any]] = field(default_factory=list)

    def points(self, key: str) -> list[Point]:
        """The series' figures for one measure, by P; rows without it are left out."""
        out = []
        for r in self.rows:
            v = figure(r, key)
            if v is not None:
                out.append(Point(r["partitions"], *v))
        return sorted(out, key=lambda p: p.partitions)


def _number(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(x) else None


def figure(row: dict[str, Any], key: str) -> tuple[float, float, float] | None:
    """(value, low, high) of one measure in one row: a number is its own low and high; a
    per-server dict gives its mean, min and max. None when absent or not numbers."""
    x = row.get(key)
    if isinstance(x, dict):
        vals = [_number(v) for v in x.values()]
        nums = [v for v in vals if v is not None]
        if not nums or len(nums) != len(vals):
            return None
        return sum(nums) / len(nums), min(nums), max(nums)
    v = _number(x)
    return None if v is None else (v, v, v)


def load(path: Path) -> list[dict[str, Any]]:
    """The rows of one bench_partitions ``--json`` file, checked: a list of objects, each
    with a whole ``partitions`` >= 1 and, when present, a whole ``topics`` >= 1."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not JSON: {exc}") from None
    if not isinstance(data, list):
        raise InputError(f"{path}: not a list of results (bench_partitions.py --json)")
    for i, r in enumerate(data):
        if not isinstance(r, dict):
            raise InputError(f"{path}: result {i} is not an object")
        for k, required in (("partitions", True), ("topics", False)):
            v = r.get(k)
            if v is None and not required:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(f"{path}: result {i}: {k!r} must be a whole number >= 1")
    return data


def series(paths: list[Path], labels: list[str] | None = None) -> list[Series]:
    """One series per (file, topic count), labelled by the file's label (default: its
    name without .json) and the topic count, unless the file holds one topic count that
    is 1 or that its given label names."""
    if labels is not None and len(labels) != len(paths):
        raise InputError(f"{len(labels)} labels for {len(paths)} files")
    out = []
    for i, path in enumerate(paths):
        rows = load(path)
        label = labels[i] if labels is not None else path.stem
        by_topics: dict[int, list[dict[str, Any]]] = {}
        for r in rows:
            by_topics.setdefault(r.get("topics", 1), []).append(r)
        for k in sorted(by_topics):
            plain = list(by_topics) == [1] or (len(by_topics) == 1 and labels is not None)
            name = label if plain else f"{label}, {k} topic{'s' * (k > 1)}"
            out.append(Series(name, by_topics[k]))
    return out


def plot(all_series: list[Series], out: Path, note: str = "") -> None:
    import matplotlib as mpl

    mpl.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for ax, (key, title) in zip(axes.flat, MEASURES, strict=True):
        drawn = False
        for s in all_series:
            pts = s.points(key)
            if not pts:
                continue
            xs = [p.partitions for p in pts]
            ys = [p.value for p in pts]
            # (max 0: a mean of equal floats may land a rounding error past them)
            err = [
                [max(0.0, p.value - p.low) for p in pts],
                [max(0.0, p.high - p.value) for p in pts],
            ]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=s.label)
            drawn = True
        ax.set_xscale("log")
        ax.set_xlabel("partitions P (log scale)")
        ax.set_title(title, fontsize=10)
        ax.set_ylim(bottom=0)
        ax.grid(True, which="both", alpha=0.3)
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(
        "What many partitions cost, R=3 on 3 servers (bench/bench_partitions.py)"
        + (f"\n{note}" if note else ""),
        fontsize=11,
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--json",
        type=Path,
        nargs="+",
        required=True,
        help="bench_partitions.py --json outputs, one series (per topic count) each",
    )
    ap.add_argument(
        "--labels", help="comma-separated series labels, one per file (default: file names)"
    )
    ap.add_argument(
        "--note", default="", help="a second title line: the machine, its load, the commit"
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=ROOT / "docs/img/partitions.png",
        help="the PNG written (default docs/img/partitions.png)",
    )
    args = ap.parse_args(argv)
    labels = args.labels.split(",") if args.labels is not None else None
    try:
        found = series(args.json, labels)
    except InputError as exc:
        ap.error(str(exc))
    if importlib.util.find_spec("matplotlib") is None:
        ap.error("drawing needs matplotlib (the project's bench extra: pip install -e '.[bench]')")
    plot(found, args.out, args.note)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
