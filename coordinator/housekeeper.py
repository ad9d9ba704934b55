"""The coordinator's background duties, on one thread: create the ZooKeeper layout once it
is reachable, keep this coordinator's ephemeral ``/coordinators/<id>`` registered (again
after a lost session), and sweep PIDs past retention every ``pid_sweep_interval_ms`` (only
on the first live coordinator by id).

It wakes on every ZooKeeper state change (kazoo's listener only sets an event: blocking
calls are not allowed on kazoo's own thread) and at least once a second.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from coordinator.store import Store
from pidlease.errors import PidleaseError

log = logging.getLogger("coordinator.housekeeper")

POLL_S = 1.0


class Housekeeper:
    def __init__(
        self,
        store: Store,
        coordinator_id: str,
        info: dict[str, Any],
        sweep: Callable[[], int],
        sweep_interval_ms: int,
    ) -> None:
        self.store = store
        self.coordinator_id = coordinator_id
        self.info = info
        self._sweep = sweep
        self._sweep_interval_s = sweep_interval_ms / 1000
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="housekeeper", daemon=True)
        # Not right at start (a sweep reads every PID record: it would land on the load a
        # fresh coordinator is started for), and not in step with the other coordinators.
        self._next_sweep = time.monotonic() + self._sweep_interval_s * random.uniform(0.5, 1.0)
        self.sweeps_skipped = 0
        self.registrations = 0
        self.swept = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.store.state_changed.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.store.state_changed.clear()
            if self.store.connected:
                try:
                    self.tick()
                except PidleaseError as exc:
                    log.warning("housekeeping failed, will retry: %s", exc.detail)
                except Exception:  # a bug here must not kill registration for good
                    log.exception("housekeeping failed unexpectedly, will retry")
            self.store.state_changed.wait(POLL_S)

    def _is_sweeper(self) -> bool:
        """One coordinator sweeps: the first live one by id. A sweep reads every PID record,
        so N coordinators sweeping would cost N times that for nothing. Two that both think
        they are first (a registration changing) only sweep twice: deletes are versioned."""
        try:
            live = self.store.coordinators()
        except PidleaseError:
            return True
        return not live or live[0] == self.coordinator_id

    def tick(self) -> None:
        if not self.store.layout_ready:
            self.store.ensure_layout()
            log.info("ZooKeeper layout ready at %s", self.store.hosts)
        if self.store.register(self.coordinator_id, self.info):
            self.registrations += 1
            log.info(
                "registered /coordinators/%s (registration %d)",
                self.coordinator_id,
                self.registrations,
            )
        if time.monotonic() >= self._next_sweep:
            self._next_sweep = time.monotonic() + self._sweep_interval_s
            if not self._is_sweeper():
                self.sweeps_skipped += 1
                return
            n = self._sweep()
            self.swept += n
            if n:
                log.info("swept %d PIDs past retention", n)
