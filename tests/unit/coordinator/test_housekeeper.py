"""Only the first live coordinator by id sweeps, the first sweep is not at start, and a
coordinator that cannot read the list sweeps rather than never (deletes are versioned, so
a double sweep is harmless)."""

from __future__ import annotations

import threading
import time

from coordinator.housekeeper import Housekeeper
from pidlease.errors import CoordinatorUnavailable


class FakeStore:
    def __init__(self, live: list[str] | None) -> None:
        self.live = live
        self.layout_ready = True
        self.state_changed = threading.Event()

    def register(self, coordinator_id: str, info: dict) -> bool:  # type: ignore[type-arg]
        return False

    def coordinators(self) -> list[str]:
        if self.live is None:
            raise CoordinatorUnavailable("ZooKeeper down")
        return sorted(self.live)


def run_ticks(me: str, live: list[str] | None, interval_ms: int = 20) -> tuple[int, Housekeeper]:
    swept = []
    hk = Housekeeper(FakeStore(live), me, {}, lambda: swept.append(1) or 0, interval_ms)  # type: ignore[arg-type]
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        hk.tick()
        time.sleep(0.005)
    return len(swept), hk


def test_only_the_first_coordinator_by_id_sweeps() -> None:
    first, _ = run_ticks("a-1", ["a-1", "b-2", "c-3"])
    other, hk = run_ticks("b-2", ["a-1", "b-2", "c-3"])
    assert first >= 5
    assert other == 0 and hk.sweeps_skipped >= 5


def test_sweeps_when_the_list_cannot_be_read_or_is_empty() -> None:
    assert run_ticks("b-2", None)[0] >= 5
    assert run_ticks("b-2", [])[0] >= 5


def test_first_sweep_waits_half_an_interval_at_least() -> None:
    hk = Housekeeper(FakeStore(["a"]), "a", {}, lambda: 0, 60_000)  # type: ignore[arg-type]
    assert hk._next_sweep - time.monotonic() >= 29.0
