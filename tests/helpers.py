"""Small helpers that tests in several folders share: polling with a deadline, a clock the
test moves by hand, one-line calls to a running cluster's coordinator, and the command
line. Fixtures live in ``tests/conftest.py``; the public test tools (wire client, fakes,
local cluster) in ``pidlease.testing``. Import as ``from tests.helpers import ...`` (the
repository root is on ``sys.path`` under ``python -m pytest``, as ``tests.sim`` already
needs)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

from partition_server.metrics import parse_text
from pidlease.testing.devcluster import LocalCluster, http_json

T = TypeVar("T")


def wait_for(
    check: Callable[[], T | None],
    timeout_s: float = 60.0,
    what: str = "a condition",
    *,
    interval_s: float = 0.05,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``check`` every ``interval_s`` until it returns something truthy, and return
    that. Past ``timeout_s`` the test fails naming ``what``. Exceptions in ``ignore`` count
    as "not yet" (e.g. ``OSError`` while a server is down)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            got = check()
        except ignore:
            pass
        else:
            if got:
                return got
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s waiting for {what}"
        time.sleep(interval_s)


async def wait_until(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """``wait_for`` for a coroutine: yields to the event loop between checks."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


class ManualClock:
    """A millisecond clock that moves only when the test sets or advances ``now``; pass it
    wherever the code takes ``clock_ms``."""

    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def lease_pid(
    at: LocalCluster | str, *, timeout_s: float = 10.0, **body: Any
) -> tuple[int, dict[str, Any]]:
    """``POST /v1/lease_pid`` to a cluster's (or a URL's) coordinator: (status, JSON body).
    The body asks for a new PID on partition 0 of ``orders``; keywords override or add."""
    url = at.coordinator_url if isinstance(at, LocalCluster) else at
    req = {"topic": "orders", "partition": 0, "pid": -1, **body}
    return http_json("POST", url + "/v1/lease_pid", req, timeout_s)


def leased(at: LocalCluster | str, *, expect: int = 200, **body: Any) -> dict[str, Any]:
    """``lease_pid`` that asserts the status (200 unless ``expect``) and returns the body."""
    status, got = lease_pid(at, **body)
    assert status == expect, got
    return got


def scrape_metrics(url: str) -> dict[Any, float]:
    """A server's ``/metrics`` (Prometheus text), parsed: {(name, labels): value}."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["content-type"].startswith("text/plain")
        return parse_text(resp.read().decode())


def cli(
    *args: str, url: str | None = None, stdin: str | None = None, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m pidlease.cli ARGS`` (against the coordinator at ``url``, if given)
    and return it finished, output captured as text; never raises on a non-zero exit."""
    env = dict(os.environ)
    if url is not None:
        env["PIDLEASE_COORDINATOR"] = url
    return subprocess.run(
        [sys.executable, "-m", "pidlease.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )
