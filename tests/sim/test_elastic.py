"""The simulation's elasticity (tests/sim/elastic.py): with it forced on, seeds replay
exactly, the runs do SIGTERM handovers, preferred-leader handovers and replica moves
(some interrupted by a coordinator crash and resumed), and the checker finds nothing."""

from __future__ import annotations

import pytest

from tests.sim.world import run_seed


@pytest.fixture
def elastic_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIDLEASE_SIM_ELASTIC", "1")


@pytest.mark.usefixtures("elastic_on")
def test_elastic_seeds_replay_exactly() -> None:
    a, b = run_seed(0, verbose=True), run_seed(0, verbose=True)
    assert "elastic" in a.plan
    assert a.trace == b.trace
    assert a.faults == b.faults


@pytest.mark.usefixtures("elastic_on")
def test_elastic_seeds_move_hand_over_and_pass() -> None:
    seen: dict[str, int] = {}
    lines: list[str] = []
    for seed in range(15):
        r = run_seed(seed, verbose=True)
        assert r.ok, (seed, r.failures)
        for k, v in r.faults.items():
            seen[k] = seen.get(k, 0) + v
        lines += r.trace
    text = "\n".join(lines)
    assert seen.get("move", 0) > 0 and seen.get("sigterm", 0) > 0, seen
    assert seen.get("mover_crash", 0) > 0, seen
    assert "(leaving) -> " in text  # a controlled shutdown handed leadership over
    assert "(preferred replica) -> " in text  # a preferred-leader handover
    assert ": done: replicas" in text  # a move ran to its end
    assert "resume:" in text  # and one was resumed after a coordinator crash
