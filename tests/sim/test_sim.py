"""The deterministic simulation in CI (short form) and by flag (long form).

Short form: seeds 0.. until ``SHORT_SEEDS`` ran or ``SHORT_SECONDS`` passed, whichever
comes first (both bound it; a slower machine runs fewer seeds, never longer). Long form
(``--sim-long`` or ``PIDLEASE_SIM_LONG=1``): more seeds, from ``PIDLEASE_SIM_START``
(default: after the short form's). Every failing seed is listed with the command that
replays it."""

from __future__ import annotations

import io
import os
import random

import pytest

from tests.sim.cli import replay_command, run_many
from tests.sim.disk import DiskFaults, DiskShim
from tests.sim.loop import Node
from tests.sim.world import World, run_seed

SHORT_SEEDS = 2000
SHORT_SECONDS = 120.0
# With ``--retention``: other seeds, so the two forms search different runs.
RETENTION_START = 500_000
RETENTION_SEEDS = 1000
RETENTION_SECONDS = 60.0
LONG_SEEDS = 200_000
LONG_SECONDS = 3600.0


@pytest.fixture
def sim_long(request: pytest.FixtureRequest) -> bool:
    return bool(
        request.config.getoption("--sim-long", default=False) or os.environ.get("PIDLEASE_SIM_LONG")
    )


def test_a_seed_replays_exactly() -> None:
    """Same seed, same run: the trace of events (server log lines included) is identical."""
    for seed in (3, 4):
        a, b = run_seed(seed, verbose=True), run_seed(seed, verbose=True)
        assert a.trace == b.trace
        assert len(a.trace) > 50
        assert a.checks == b.checks and a.faults == b.faults


def test_retention_runs_delete_segments_and_replay_exactly() -> None:
    """``--retention`` (off by default, see README): segments go during the run, the
    deleted batches are kept aside for the checker, and a seed still replays exactly."""
    for seed in (4, 8):  # 3 servers; 1 server with crashes and a takeover
        a, b = (
            run_seed(seed, verbose=True, retention=True),
            run_seed(seed, verbose=True, retention=True),
        )
        assert a.trace == b.trace
        assert a.segments_deleted > 0 and a.segments_deleted == b.segments_deleted
        assert a.ok, a.failures


def test_kafka_and_zk3_runs_replay_exactly() -> None:
    """``--kafka --zk3``: Kafka producers (SASL, InitProducerId, Produce through each
    server's real Kafka listener) and a 3-server ZooKeeper with a member cut off from the
    quorum; a seed still replays exactly, and both paths do run."""
    for seed in (3, 4):
        a = run_seed(seed, verbose=True, kafka=True, zk3=True)
        b = run_seed(seed, verbose=True, kafka=True, zk3=True)
        assert a.trace == b.trace
        assert a.kafka_acked > 0 and a.kafka_acked == b.kafka_acked
        assert any("InitProducerId: pid" in line for line in a.trace)
        assert a.faults.get("zk_cut_off", 0) > 0
        assert any("cut off from the quorum" in line for line in a.trace)


def test_the_default_mix_has_kafka_zk3_and_buggify_seeds() -> None:
    """Without flags the new paths come in some seeds (the short forms run them)."""
    plans = [World(seed).plan_only() for seed in range(60)]
    assert sum("kafka" in p for p in plans) >= 10
    assert sum("zk" in p for p in plans) >= 1
    assert sum("buggify" in p for p in plans) >= 10


def test_crash_keeps_what_was_fsynced_and_maybe_a_torn_tail(tmp_path: object) -> None:
    rng = random.Random(7)
    seen = set()
    for _ in range(30):
        d = os.path.join(str(tmp_path), f"d{len(seen)}-{rng.random()}")
        os.makedirs(d)
        disk = DiskShim(rng, lambda: 0.0, DiskFaults(), lambda *_: None)
        node = Node("n")
        fd = disk.open(os.path.join(d, "0.log"), os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        disk.write(fd, b"a" * 100)
        disk.fsync(fd)
        disk.write(fd, b"b" * 100)
        disk.fd_node[fd] = node
        disk.crash(node, d)
        size = os.path.getsize(os.path.join(d, "0.log"))
        assert 100 <= size <= 200
        seen.add(size)
    assert 100 in seen and 200 in seen and len(seen) > 3  # cut, kept, torn


def _run(seeds: int, start: int, seconds: float, *, retention: bool = False) -> None:
    out = io.StringIO()
    tot = run_many(seeds, start, seconds / 60, stop_on_failure=False, out=out, retention=retention)
    print(out.getvalue())
    assert tot.runs > 0
    assert not tot.failed, (
        f"{len(tot.failed)} of {tot.runs} seeds failed; replay one with "
        f"`{replay_command(tot.failed[0], retention)}`\n{out.getvalue()[-6000:]}"
    )


def test_simulation_short_form(sim_long: bool) -> None:
    if sim_long:
        pytest.skip("the long form runs instead")
    _run(SHORT_SEEDS, 0, SHORT_SECONDS)


def test_simulation_short_form_with_retention(sim_long: bool) -> None:
    """Retention among the faults (``--retention``): the follower-cut bug of seed 1863
    kept it out of CI until ``Partition.truncate_to`` rewound the state to the cut."""
    if sim_long:
        pytest.skip("the long form runs instead")
    _run(RETENTION_SEEDS, RETENTION_START, RETENTION_SECONDS, retention=True)


def test_simulation_long_form(sim_long: bool) -> None:
    if not sim_long:
        pytest.skip("long form: --sim-long or PIDLEASE_SIM_LONG=1")
    start = int(os.environ.get("PIDLEASE_SIM_START", SHORT_SEEDS))
    _run(LONG_SEEDS, start, LONG_SECONDS)
