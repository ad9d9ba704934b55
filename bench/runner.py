"""Run P producers as separate processes, released together, and collect their Outcomes.

A producer is a module-level function ``produce(cfg, index, phase, value_bytes, records,
ready)`` of a ``bench.peers`` module (named by string, so the spawned child imports it
itself). It connects and prepares everything, calls ``ready()`` (a barrier shared by
all producers) and only then starts its clock, so connection set-up and imports are not
timed. Spawned, not forked: the parent holds event loops, threads and sockets.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import queue
import time
import traceback
from typing import Any

from bench.workload import Outcome


def _child(
    target: str,
    cfg: dict[str, Any],
    index: int,
    phase: str,
    value_bytes: int,
    records: int,
    barrier: Any,
    out: Any,
) -> None:
    try:
        mod_name, _, fn_name = target.partition(":")
        fn = getattr(importlib.import_module(mod_name), fn_name)
        outcome: Outcome = fn(cfg, index, phase, value_bytes, records, lambda: barrier.wait(600))
        out.put(("ok", index, outcome.to_dict()))
    except BaseException:  # noqa: BLE001 - the parent must hear of any failure
        try:
            barrier.abort()
        finally:
            out.put(("error", index, traceback.format_exc()))


def run_producers(
    target: str,
    cfg: dict[str, Any],
    *,
    producers: int,
    phase: str,
    value_bytes: int,
    records: int,
    timeout_s: float = 900,
) -> list[Outcome]:
    """Start ``producers`` processes running ``target``; raise if any fails or the pass
    takes longer than ``timeout_s`` (then every child is terminated)."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(producers)
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=_child,
            args=(target, cfg, i, phase, value_bytes, records, barrier, out),
            daemon=True,
        )
        for i in range(producers)
    ]
    for p in procs:
        p.start()
    results: dict[int, Outcome] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) < producers:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{target} {phase}: producers did not finish in {timeout_s}s")
            try:
                kind, index, payload = out.get(timeout=min(left, 5))
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(
                        f"{target} {phase}: a producer exited with {dead[0].exitcode}"
                    ) from None
                continue
            if kind == "error":
                raise RuntimeError(f"{target} {phase}: producer {index} failed:\n{payload}")
            results[index] = Outcome(**payload)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(5)
    return [results[i] for i in range(producers)]
