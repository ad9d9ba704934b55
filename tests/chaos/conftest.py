"""Options of the chaos suite: ``--chaos-long`` (or ``PIDLEASE_CHAOS_LONG=1``) for longer
runs with more seeds; ``--chaos-seed N`` (or ``PIDLEASE_CHAOS_SEED=N``) replays one seed."""

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
    return bool(request.config.getoption("--chaos-long") or os.environ.get("PIDLEASE_CHAOS_LONG"))


@pytest.fixture
def chaos_seed(request: pytest.FixtureRequest) -> int | None:
    seed = request.config.getoption("--chaos-seed")
    if seed is None and os.environ.get("PIDLEASE_CHAOS_SEED"):
        seed = int(os.environ["PIDLEASE_CHAOS_SEED"])
    return seed
