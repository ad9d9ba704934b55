"""Options of the chaos suite: ``--chaos-long`` (or ``PIDLEASE_CHAOS_LONG=1``) for longer
runs with more seeds; ``--chaos-seed N`` (or ``PIDLEASE_CHAOS_SEED=N``) replays one seed.

pytest reads options only from conftests next to the paths on its command line, so the
flags need ``tests/chaos`` (or a file in it) named there; the environment variables work
from anywhere."""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("chaos")
    group.addoption("--chaos-long", action="store_true", default=False,
                    help="run the chaos suite's long form (more seeds, longer runs)")
    group.addoption("--chaos-seed", type=int, default=None,
                    help="replay one chaos seed (same as PIDLEASE_CHAOS_SEED)")


@pytest.fixture
def chaos_long(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--chaos-long", default=False) or os.environ.get("PIDLEASE_CHAOS_LONG"))


@pytest.fixture
def chaos_seed(request: pytest.FixtureRequest) -> int | None:
    seed = request.config.getoption("--chaos-seed", default=None)
    if seed is None and os.environ.get("PIDLEASE_CHAOS_SEED"):
        seed = int(os.environ["PIDLEASE_CHAOS_SEED"])
    return seed
