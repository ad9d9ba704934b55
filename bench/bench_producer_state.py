"""Cost of ``check_append`` + ``apply_append`` per batch, on strict (sequence H+1) and on
monotonic with explicit ids (gaps of 2), for the producer-state table at HEAD and, when a
git revision is given, at that revision in the same process (rounds alternate, best of
each kept, so both see the same machine load).

    python -m bench.bench_producer_state [--rev REV] [--batches 200000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import partition_server.producer_state as head


def load_rev(rev: str) -> ModuleType:
    """``partition_server/producer_state.py`` as it was at ``rev``, imported under its own
    name (its imports resolve against the current tree)."""
    src = subprocess.run(
        ["git", "show", f"{rev}:partition_server/producer_state.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "producer_state_rev.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("producer_state_rev", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def run(mod: Any, mode: str, n: int) -> float:
    """Microseconds per check+apply over ``n`` batches of 10 records from 100 PIDs."""
    t = mod.ProducerStateTable(mode=mode)
    step = 10 if mode == "strict" else 12  # monotonic: explicit ids with a gap of 2
    pids = 100
    seqs = [0] * pids
    check, apply = t.check_append, t.apply_append
    t0 = time.perf_counter()
    off = 0
    for i in range(n):
        p = i % pids
        pid = p + 1
        base = seqs[p]
        d = check(pid, 1, base, 10, i)
        apply(pid, 1, base, 10, off, i, durable=True)
        seqs[p] = base + step
        off += 10
    dt = time.perf_counter() - t0
    assert d.outcome.name == "APPEND"
    return dt / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rev", default=None, help="git revision to compare with")
    ap.add_argument("--batches", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    mods: dict[str, Any] = {"head": head}
    if a.rev:
        mods[a.rev] = load_rev(a.rev)
    best: dict[tuple[str, str], float] = {}
    for _ in range(a.rounds):
        for mode in ("strict", "monotonic"):
            for name, mod in mods.items():
                us = run(mod, mode, a.batches)
                key = (name, mode)
                best[key] = min(best.get(key, us), us)
    for (name, mode), us in sorted(best.items()):
        print(f"{name:>10} {mode:>9}: {us:.3f} us per check+apply (best of {a.rounds})")


if __name__ == "__main__":
    main()
