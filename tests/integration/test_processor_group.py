"""Processor instances sharing input partitions through a consumer group (``group=True``),
as real processes: two members split ``raw``'s partitions; one is paused (SIGSTOP) until
the group gives its partitions to the other, whose producers lease the same names and so
fence it, then resumed (a zombie with batches to send); then the other is SIGKILLed and
the first takes everything over. Meanwhile the input grows; at the end ``clean`` is
exactly the function of ``raw``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from itertools import count
from pathlib import Path
from typing import Any

import pytest

from pidlease import Producer, Reader
from pidlease.testing.devcluster import LocalCluster
from pidlease.testing.zkserver import ZooKeeperCluster
from tests.integration import processor_workers as workers

ROOT = Path(__file__).resolve().parents[2]
RECORDS = 6000
ALL = list(range(workers.PARTITIONS))
_ids = count()


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _spawn(url: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.integration.processor_workers", "clean-group", url],
            cwd=ROOT,
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _shares(log: Path) -> list[list[int]]:
    """The partitions each group generation gave this member, in order."""
    text = log.read_text() if log.exists() else ""
    return [
        [int(x) for x in m.group(1).split(",") if x.strip()]
        for m in re.finditer(r"gives this member partitions \[([0-9, ]*)\]", text)
    ]


def _wait(what: str, cond: Any, timeout_s: float, *logs: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"{what}: " + "\n".join(
            p.read_text()[-2500:] for p in logs if p.exists()
        )
        time.sleep(0.1)


def _records(url: str, topic: str, partition: int) -> list[Any]:
    with Reader(url, topic, partition) as rd:
        return list(rd)


def test_group_members_share_partitions_and_a_takeover_fences_the_old_holder(
    make_cluster: Any, tmp_path: Path
) -> None:
    cluster = make_cluster(servers=1)
    url = cluster.coordinator_url
    cluster.create_topic("raw", partitions=workers.PARTITIONS)
    cluster.create_topic("clean", partitions=workers.PARTITIONS, dedup="monotonic")
    loaded = threading.Event()

    def load() -> None:
        with Producer(url, topic="raw", producer_name="raw-loader") as p:
            for start in range(0, RECORDS, 200):
                ids = range(start, start + 200)
                p.send_batch([b"v-%d" % i for i in ids], keys=[b"k%d" % (i % 13) for i in ids])
                time.sleep(0.5)
            p.flush()
        loaded.set()

    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    a = _spawn(url, log_a)
    _wait("a alone has every partition", lambda: ALL in _shares(log_a), 90, log_a)
    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    b = _spawn(url, log_b)
    try:
        # the group splits the partitions between the two members
        _wait(
            "a and b share the partitions",
            lambda: (
                bool(_shares(log_a) and _shares(log_b))
                and sorted(_shares(log_a)[-1] + _shares(log_b)[-1]) == ALL
                and bool(_shares(log_b)[-1])
                and bool(_shares(log_a)[-1])
            ),
            90,
            log_a,
            log_b,
        )
        a_had = _shares(log_a)[-1]
        # a pauses: its session times out and b takes a's partitions, fencing a's producers
        a.send_signal(signal.SIGSTOP)
        _wait("b takes everything over", lambda: _shares(log_b)[-1] == ALL, 60, log_b)
        time.sleep(2)  # b writes a's partitions under the names a held
        a.send_signal(signal.SIGCONT)
        # the zombie learns it at its next write or renewal, or from the group first
        _wait(
            "a hears of the takeover",
            lambda: "(fenced)" in log_a.read_text() or len(_shares(log_a)) > 2,
            60,
            log_a,
        )
        fenced = "(fenced)" in log_a.read_text()
        # b dies; a (back in the group) takes every partition over
        _wait("the group settles with a back in it", lambda: bool(_shares(log_a)[-1]), 60, log_a)
        b.send_signal(signal.SIGKILL)
        b.wait(10)
        _wait("a takes b's partitions over", lambda: _shares(log_a)[-1] == ALL, 60, log_a)
        loader.join(120)
        assert loaded.is_set()
        want_total = 2 * RECORDS  # fan-out 2
        _wait(
            "a processes the whole input",
            lambda: sum(len(_records(url, "clean", p)) for p in ALL) >= want_total,
            120,
            log_a,
        )
        time.sleep(1)  # nothing more may come
    finally:
        for proc in (a, b):
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
    for p in ALL:
        want = [out for r in _records(url, "raw", p) for out in workers.clean(r)]
        got = [(r.key, r.value) for r in _records(url, "clean", p)]
        assert got == want, f"partition {p}: {len(got)} outputs against {len(want)} expected"
    assert a_had and set(a_had) <= set(ALL)
    print(f"a had {a_had} before its pause; fenced at its resume: {fenced}")


@pytest.fixture
def two_small_clusters(zookeeper: ZooKeeperCluster, tmp_path: Path):  # type: ignore[no-untyped-def]
    made: list[LocalCluster] = []
    for side in ("src", "dst"):
        hosts = f"{zookeeper.hosts}/group{os.getpid()}-{next(_ids)}-{side}"
        made.append(LocalCluster(tmp_path / side, servers=1, zk_hosts=hosts).start())
    yield made
    for c in made:
        c.stop()


def test_mirrors_in_a_group_split_the_partitions_and_take_over_a_killed_one(  # type: ignore[no-untyped-def]
    two_small_clusters, tmp_path: Path
) -> None:
    """``pidlease mirror --group``: two instances split the source's partitions; one is
    SIGKILLed and the other takes everything over; the target is the source, once."""
    from tests.integration.test_processor_mirror import check_mirror

    src, dst = two_small_clusters
    partitions, records = 4, 8000
    src.create_topic("orders", partitions=partitions)
    every = list(range(partitions))

    def load() -> None:
        with Producer(src.coordinator_url, topic="orders", producer_name="loader") as p:
            for start in range(0, records, 400):
                ids = range(start, start + 400)
                p.send_batch([b"v-%d" % i for i in ids], keys=[b"k%d" % (i % 31) for i in ids])
                time.sleep(0.4)
            p.flush()

    args = ["--source", src.coordinator_url, "--target", dst.coordinator_url]
    args += ["--topics", "orders", "--name", "dc1-to-dc2", "--group"]
    logs = [tmp_path / "mirror-a.log", tmp_path / "mirror-b.log"]

    def spawn(log: Path) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "pidlease", "mirror", *args],
                cwd=ROOT,
                env=_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    a = spawn(logs[0])
    procs = [a]
    try:
        _wait("a has every partition", lambda: every in _shares(logs[0]), 90, *logs)
        loader = threading.Thread(target=load, daemon=True)
        loader.start()
        b = spawn(logs[1])
        procs.append(b)
        _wait(
            "a and b split the partitions",
            lambda: (
                bool(_shares(logs[0]) and _shares(logs[1]))
                and bool(_shares(logs[0])[-1])
                and sorted(_shares(logs[0])[-1] + _shares(logs[1])[-1]) == every
            ),
            90,
            *logs,
        )
        time.sleep(1.5)  # both copy for a while
        a.send_signal(signal.SIGKILL)
        a.wait(10)
        _wait("b takes a's partitions over", lambda: _shares(logs[1])[-1] == every, 60, *logs)
        loader.join(120)
        _wait(
            "the target has every record",
            lambda: sum(len(_records(dst.coordinator_url, "orders", p)) for p in every) >= records,
            120,
            *logs,
        )
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
    assert check_mirror(src.coordinator_url, dst.coordinator_url, "orders", partitions) == records
