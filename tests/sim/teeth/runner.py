"""``python -m tests.sim teeth``: bring back each catalogued bug in a scratch copy and run
the search that must find it.

    python -m tests.sim teeth [--only NAME ...] [--short] [--jobs N] [--baseline]
    python -m tests.sim teeth --check        # every patch still applies (fast, no search)

Per bug: a scratch copy of the repository's tracked files as they are in the working
tree (uncommitted edits included, so a fix can be tested before it is committed), the
bug's patches applied there, then its search with the copy first on ``PYTHONPATH``:
``python -m tests.sim run --seeds BUDGET --stop-on-failure SIM_ARGS...`` (found: a seed
failed; the seeds it took are counted from the first seed run), or ``pytest PYTEST``
(found: the test failed). Printed per bug: found or not, seeds to find, the failure
kind, the time. Exit 0 only when every bug expected to be found was found within its
budget and no patch was stale; a bug marked ``EXPECTED = "not found"`` is run and
printed but does not fail the run.

``--baseline`` first runs each distinct search once on an unpatched copy: it must find
nothing (else a "found" below means nothing)."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tests.sim.teeth.catalogue import Bug, CatalogueError, apply, load_all, patched_texts

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# The CI short form (tests/sim/test_teeth.py): bugs the search finds within a few seeds
# or a fast unit test, so the whole set takes well under 90 s on two loaded cores.
SHORT = (
    "rev1_per_connection_order",
    "rev2_and_1b_monotonic_block_and_guard",
    "rev6_takeover_seq0_after_unseen_expiry",
)
# Each search of the short form stops after this long (a miss then fails the test).
SHORT_MINUTES = 1.0


@dataclass
class Outcome:
    bug: Bug
    found: bool = False
    seeds: int | None = None  # seeds run up to and including the first failing one
    seed: int | None = None  # the failing seed
    kind: str = ""  # the failure kind (sim) or the first error line (pytest)
    seconds: float = 0.0
    error: str = ""  # a stale patch, a crashed search: the catalogue or the runner is wrong
    tail: str = ""  # the end of the search's output
    ran: int | None = None  # seeds the simulation ran
    per_min: int | None = None  # its speed, seeds per minute

    @property
    def ok(self) -> bool:
        """Counts as a pass of the teeth run."""
        if self.error:
            return False
        return self.found or self.bug.expected == "not found"

    def line(self) -> str:
        b = self.bug
        if self.error:
            verdict = "ERROR"
        elif self.found:
            verdict = "found" + (
                " (expected not found: update the catalogue)" if b.expected == "not found" else ""
            )
        else:
            verdict = "not found" + (" (expected)" if b.expected == "not found" else " -- MISSED")
        where = (
            f"seed {self.seed}, {self.seeds} of {b.budget} seeds"
            if self.seeds is not None
            else (f"budget {b.budget} seeds" if b.search == "sim" else f"pytest {b.pytest}")
        )
        s = f"{b.name}: {verdict}; {where}; {self.seconds:.0f}s"
        if self.ran is not None:
            s += f" ({self.ran} seeds run, {self.per_min} seeds/min)"
        if self.kind:
            s += f"; {self.kind}"
        if self.error:
            s += f"\n    {self.error}"
        return s


def tracked_files(root: str) -> list[str]:
    """The files git tracks under ``root``; without git (an unpacked archive), every file
    but those under hidden directories and caches."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached"], cwd=root, check=True, capture_output=True
        ).stdout
        return [p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if not x.startswith(".") and x != "__pycache__"]
            files += [os.path.relpath(os.path.join(d, n), root) for n in names]
        return files


def scratch_copy(root: str, dest: str) -> None:
    """The tracked files of ``root`` as they are in its working tree (a tracked file
    deleted there is left out)."""
    for rel in tracked_files(root):
        src = os.path.join(root, rel)
        if not os.path.lexists(src):
            continue
        dst = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(src, dst, follow_symlinks=False)


def _env(scratch: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = scratch
    env.pop("PIDLEASE_SIM_LONG", None)
    return env


def _run(cmd: list[str], cwd: str, timeout_s: float) -> tuple[int | None, str]:
    """Run ``cmd`` in its own process group; (return code or None on timeout, output)."""
    p = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=_env(cwd),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    with _live_lock:
        _live.add(p)
    try:
        out, _ = p.communicate(timeout=timeout_s)
        return p.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        return None, out
    finally:
        with _live_lock:
            _live.discard(p)


# The searches running now, killed when the runner is stopped (they run in their own
# process groups, so a ^C or SIGTERM of the runner would not reach them).
_live: set[subprocess.Popen[str]] = set()
_live_lock = threading.Lock()


def _kill_live() -> None:
    with _live_lock:
        for p in _live:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)


def _check_imports_from(scratch: str) -> None:
    code = "import partition_server, tests.sim; print(partition_server.__file__)"
    rc, out = _run([sys.executable, "-c", code], scratch, 60)
    if rc != 0 or not os.path.realpath(out.strip()).startswith(os.path.realpath(scratch)):
        raise RuntimeError(f"the scratch copy's code is not what runs there: {out.strip()!r}")


_FAILED = re.compile(r"^seed (\d+) FAILED", re.MULTILINE)
_KIND = re.compile(r"^  ([a-z-]+): \d+ seeds, first (\d+)", re.MULTILINE)
_PROBLEM = re.compile(r"^  - (.*)$", re.MULTILINE)
_TOTALS = re.compile(r"^(\d+) seeds in [\d.]+s \((\d+) seeds/min\)", re.MULTILINE)


def sim_search(
    scratch: str, budget: int, sim_args: Sequence[str], start: int, minutes: float | None
) -> tuple[int | None, Outcome]:
    """Run the simulation in ``scratch``; an Outcome without its bug (filled by the caller)."""
    cmd = [sys.executable, "-m", "tests.sim", "run", "--seeds", str(budget), "--stop-on-failure"]
    cmd += list(sim_args)
    if minutes is not None:
        cmd += ["--minutes", str(minutes)]
    timeout = (minutes * 60 if minutes is not None else budget * 2.0) + 300
    rc, out = _run(cmd, scratch, timeout)
    o = Outcome(bug=None, tail=out[-3000:])  # type: ignore[arg-type]
    totals = _TOTALS.findall(out)
    if totals:
        o.ran, o.per_min = int(totals[-1][0]), int(totals[-1][1])
    m = _FAILED.search(out)
    if rc is None:
        o.error = f"the simulation did not end in {timeout:.0f}s"
    elif m:
        o.found = True
        o.seed = int(m.group(1))
        o.seeds = o.seed - start + 1
        kinds = sorted({k for k, first in _KIND.findall(out) if int(first) == o.seed})
        first = _PROBLEM.search(out, m.end())
        o.kind = ",".join(kinds) + (f": {first.group(1)[:160]}" if first else "")
    elif rc != 0:
        o.error = f"the simulation exited {rc} without a failing seed: {out[-400:]!r}"
    return rc, o


def pytest_search(scratch: str, node: str, minutes: float | None) -> Outcome:
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", node]
    timeout = (minutes or 10) * 60
    rc, out = _run(cmd, scratch, timeout)
    o = Outcome(bug=None, tail=out[-3000:])  # type: ignore[arg-type]
    if rc is None:
        o.error = f"pytest did not end in {timeout:.0f}s"
    elif rc == 1:
        o.found = True
        e = re.search(r"^E\s+(.*)$", out, re.MULTILINE)
        o.kind = "test failed" + (f": {e.group(1)[:160]}" if e else "")
    elif rc != 0:
        o.error = (
            f"pytest exited {rc} (not a test failure: a collection or usage error?): {out[-600:]!r}"
        )
    return o


def run_bug(bug: Bug, root: str, minutes: float | None = None, keep: bool = False) -> Outcome:
    t0 = time.perf_counter()
    scratch = tempfile.mkdtemp(prefix=f"pidlease-teeth-{bug.name}-")
    try:
        try:
            scratch_copy(root, scratch)
            apply(bug, scratch)
            _check_imports_from(scratch)
        except (CatalogueError, RuntimeError, OSError) as e:
            return Outcome(bug=bug, error=str(e), seconds=time.perf_counter() - t0)
        if bug.search == "sim":
            _, o = sim_search(scratch, bug.budget, bug.sim_args, bug.sim_start, minutes)
        else:
            o = pytest_search(scratch, bug.pytest, minutes)
        o.bug = bug
        o.seconds = time.perf_counter() - t0
        return o
    finally:
        if keep:
            print(f"  (kept {scratch})", flush=True)
        else:
            shutil.rmtree(scratch, ignore_errors=True)


def baseline(bugs: Iterable[Bug], root: str, minutes: float | None) -> list[str]:
    """Each distinct search once on an unpatched copy; the problems it found."""
    sims: dict[tuple[str, ...], Bug] = {}
    nodes: set[str] = set()
    for b in bugs:
        if b.search == "sim":
            key = tuple(b.sim_args)
            if key not in sims or sims[key].budget < b.budget:
                sims[key] = b
        else:
            nodes.add(b.pytest)
    problems: list[str] = []
    scratch = tempfile.mkdtemp(prefix="pidlease-teeth-baseline-")
    try:
        scratch_copy(root, scratch)
        for key, b in sims.items():
            t0 = time.perf_counter()
            _, o = sim_search(scratch, b.budget, list(key), b.sim_start, minutes)
            what = f"baseline sim {' '.join(key) or '(no flags)'} {b.budget} seeds"
            verdict = "FAILED" if (o.found or o.error) else "ok"
            print(f"{what}: {verdict} ({time.perf_counter() - t0:.0f}s)", flush=True)
            if verdict != "ok":
                problems.append(f"{what}: {o.kind or o.error}")
        for node in sorted(nodes):
            t0 = time.perf_counter()
            o = pytest_search(scratch, node, minutes)
            verdict = "FAILED" if (o.found or o.error) else "ok"
            print(
                f"baseline pytest {node}: {verdict} ({time.perf_counter() - t0:.0f}s)", flush=True
            )
            if verdict != "ok":
                problems.append(f"baseline pytest {node}: {o.kind or o.error}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return problems


def check(bugs: Iterable[Bug], root: str) -> list[str]:
    """Every bug's patches apply to the working tree at ``root``: the stale ones."""
    stale = []
    for b in bugs:
        try:
            patched_texts(b, root)
        except CatalogueError as e:
            stale.append(str(e))
    return stale


def markdown(outcomes: Iterable[Outcome]) -> str:
    rows = [
        "| bug | origin | search | budget | seeds to find | found? |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for o in outcomes:
        b = o.bug
        search = (
            f"sim {' '.join(b.sim_args)}".strip() if b.search == "sim" else f"pytest `{b.pytest}`"
        )
        seeds = str(o.seeds) if o.seeds is not None else "-"
        found = "ERROR" if o.error else ("found" if o.found else "not found")
        if b.expected == "not found" and not o.found:
            found += f" (expected: {b.why_not_sim})"
        rows.append(
            f"| `{b.name}`: {b.title} | {b.origin} | {search} | "
            f"{b.budget if b.search == 'sim' else '-'} | {seeds} | {found} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.sim teeth",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--only", nargs="+", metavar="NAME", help="these bugs (file names, no .py)")
    ap.add_argument("--short", action="store_true", help=f"the CI subset: {', '.join(SHORT)}")
    ap.add_argument("--jobs", type=int, default=1, help="bugs run in parallel (default 1)")
    ap.add_argument("--baseline", action="store_true", help="first the searches unpatched")
    ap.add_argument("--check", action="store_true", help="only check that every patch applies")
    ap.add_argument("--minutes", type=float, default=None, help="time bound per search")
    ap.add_argument("--keep", action="store_true", help="keep the scratch copies")
    ap.add_argument("--markdown", action="store_true", help="print the table for the docs")
    args = ap.parse_args(argv)

    if args.short and args.minutes is None:
        args.minutes = SHORT_MINUTES
    bugs = load_all()
    if args.only or args.short:
        wanted = set(args.only or []) | (set(SHORT) if args.short else set())
        unknown = wanted - {b.name for b in bugs}
        if unknown:
            print(f"no such bug: {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        bugs = [b for b in bugs if b.name in wanted]

    stale = check(bugs, ROOT)
    for s in stale:
        print(f"STALE: {s}", flush=True)
    if args.check:
        print(f"{len(bugs) - len(stale)} of {len(bugs)} bugs apply", flush=True)
        return 1 if stale else 0

    if args.baseline:
        problems = baseline(bugs, ROOT, args.minutes)
        if problems:
            print("the unpatched tree fails the searches; a 'found' would mean nothing:")
            print("\n".join(problems))
            return 1

    t0 = time.perf_counter()
    lock = threading.Lock()

    def one(b: Bug) -> Outcome:
        o = run_bug(b, ROOT, args.minutes, args.keep)
        with lock:
            print(o.line(), flush=True)
        return o

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    ex = ThreadPoolExecutor(max_workers=max(1, args.jobs))
    try:
        outcomes = list(ex.map(one, bugs))
    finally:
        ex.shutdown(wait=False, cancel_futures=True)
        _kill_live()  # stopped early: no search outlives the runner (normally none is left)
    found = sum(o.found for o in outcomes)
    failed = [o for o in outcomes if not o.ok]
    print(
        f"{found} of {len(outcomes)} bugs found ({sum(b.expected == 'not found' for b in bugs)} "
        f"expected not found), {len(failed)} problem(s), {time.perf_counter() - t0:.0f}s "
        f"with --jobs {args.jobs}",
        flush=True,
    )
    for o in failed:
        print(f"PROBLEM {o.line()}\n--- end of its output ---\n{o.tail[-1500:]}", flush=True)
    if args.markdown:
        print(markdown(outcomes))
    return 1 if failed else 0
