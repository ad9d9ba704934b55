"""The catalogue of reintroduced bugs in CI (``tests/sim/teeth``; the full run is
``python -m tests.sim teeth``).

Every entry still applies to today's code (each ``old`` occurs exactly once and the
patched files still parse): fast, all entries. A stale one fails here with its name, so
whoever changed the code it patches brings the patch up to date (the bug must stay
reintroducible). Then the search proves it still has teeth on a small fixed set of bugs
it finds within a few seeds (``runner.SHORT``), and the runner itself is checked to say
"not found" for a patch that changes nothing that matters."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from tests.sim.teeth import runner
from tests.sim.teeth.catalogue import Bug, CatalogueError, load_all, load_bug, patched_texts


def test_every_catalogued_patch_still_applies_and_parses() -> None:
    bugs = load_all()
    assert bugs, "the catalogue is empty"
    assert runner.check(bugs, runner.ROOT) == []
    for b in bugs:
        for f, text in patched_texts(b, runner.ROOT).items():
            with open(os.path.join(runner.ROOT, f), encoding="utf-8") as fh:
                assert fh.read() != text, f"{b.name}: the patch of {f} changes nothing"
            if f.endswith(".py"):
                ast.parse(text, filename=f"{f} patched by {b.name}")  # a SyntaxError names it
    assert set(runner.SHORT) <= {b.name for b in bugs}


def test_a_stale_or_malformed_entry_is_refused(tmp_path: Path) -> None:
    stale = Bug(
        name="stale",
        title="t",
        origin="o",
        patches=[("partition_server/partition.py", "text that is nowhere in the file", "x")],
        search="sim",
        budget=10,
    )
    with pytest.raises(CatalogueError, match="occurs 0 times"):
        patched_texts(stale, runner.ROOT)
    bad = tmp_path / "x_bad.py"
    bad.write_text(
        'TITLE = "t"\nORIGIN = "o"\nPATCHES = [("a.py", "b", "c")]\nSEARCH = "pytest"\nBUDGET = 0\n'
    )
    with pytest.raises(CatalogueError, match="needs PYTEST and WHY_NOT_SIM"):
        load_bug(str(bad))
    bad.write_text('TITLE = "t"\nimport os\n')
    with pytest.raises(CatalogueError, match="only NAME = constant"):
        load_bug(str(bad))


def test_a_harmless_patch_is_not_found(tmp_path: Path) -> None:
    """The runner's "not found": a patch that only edits a comment, and a test that passes."""
    bug = Bug(
        name="harmless",
        title="a comment changed",
        origin="tests/sim/test_teeth.py",
        patches=[("tests/sim/teeth/__init__.py", "mutation testing of the search", "TEETH")],
        search="pytest",
        budget=0,
        pytest="tests/unit/server/test_refusal_guard.py::test_generations",
        why_not_sim="a check of the runner",
    )
    o = runner.run_bug(bug, runner.ROOT)
    assert not o.error, o.error
    assert not o.found and not o.ok, o.tail


def test_the_search_finds_the_short_set() -> None:
    """A few catalogued bugs the search finds quickly (well under 90 s in all on two busy
    cores): a 0-failed simulation run still means something."""
    bugs = {b.name: b for b in load_all()}
    outcomes = [runner.run_bug(bugs[n], runner.ROOT, runner.SHORT_MINUTES) for n in runner.SHORT]
    for o in outcomes:
        print(o.line())
    missed = [o for o in outcomes if not o.found or o.error]
    assert not missed, "\n".join(f"{o.line()}\n{o.tail[-2000:]}" for o in missed)
