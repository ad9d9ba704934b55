"""Processors and ``pidlease mirror`` on real clusters, SIGKILLed at random points.

- The mirror: two clusters of 3 servers each (one ZooKeeper, a chroot each), a source
  topic of 6 partitions written while the mirror (a subprocess) is SIGKILLed and restarted
  and a leader of each cluster is SIGKILLed: the target holds every source record exactly
  once, in source order per partition, keys and timestamps equal (``check_mirror``).
  Small by default; ``PIDLEASE_MIRROR_LONG=1`` is the issue's long form (200,000
  records, 5 mirror kills).
- The chain raw -> clean -> enriched of two processors with fan-out, both SIGKILLed
  repeatedly: the final topic is exactly the function of the input.
- The SQLite recipe of docs/processing.md, SIGKILLed: every record once in the table.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from itertools import count
from pathlib import Path
from typing import Any

import pytest

from pidlease import Processor, Producer, Reader, errors
from pidlease.client.lease_client import LeaseClient
from pidlease.client.mirror import same_record
from pidlease.testing.devcluster import LocalCluster
from pidlease.testing.zkserver import ZooKeeperCluster, free_port
from tests.integration import processor_workers as workers

LONG = os.environ.get("PIDLEASE_MIRROR_LONG") == "1"
ROOT = Path(__file__).resolve().parents[2]
_ids = count()


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, *args], cwd=ROOT, env=_env(), stdout=out, stderr=subprocess.STDOUT
        )


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def _records(url: str, topic: str, partition: int) -> list[Any]:
    with Reader(url, topic, partition) as rd:
        return list(rd)


def check_mirror(src: str, dst: str, topic: str, partitions: int) -> int:
    """Every source record once on the target, in order, keys, values and timestamps
    equal, each target record's sequence id its source offset. Returns the count."""
    n = 0
    for p in range(partitions):
        want = _records(src, topic, p)
        got = _records(dst, topic, p)
        assert [(r.key, r.value, r.timestamp_ms) for r in got] == [
            (r.key, r.value, r.timestamp_ms) for r in want
        ], f"partition {p}: {len(got)} target records against {len(want)} at the source"
        assert [r.sequence_id for r in got] == [r.offset for r in want]
        assert len({r.pid for r in got}) <= 1
        n += len(want)
    return n


@pytest.fixture
def two_clusters(zookeeper: ZooKeeperCluster, tmp_path: Path, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    made: list[LocalCluster] = []
    for side in ("src", "dst"):
        hosts = f"{zookeeper.hosts}/mirror{os.getpid()}-{next(_ids)}-{side}"
        made.append(LocalCluster(tmp_path / side, servers=3, zk_hosts=hosts).start())
    yield made
    rep = getattr(request.node, "rep_call", None)
    for c in made:
        if rep is None or rep.failed:
            print(c.logs())
        c.stop()


def _resumes(log: Path) -> int:
    return log.read_text().count(" resumes at ") if log.exists() else 0


def _wait_started(log: Path, resumes: int, proc: subprocess.Popen[bytes]) -> None:
    """Until the process logged ``resumes`` resume points in all (it started copying)."""
    deadline = time.monotonic() + 90
    while _resumes(log) < resumes:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the process never started"
        time.sleep(0.1)


def _scrape_lag(port: int, timeout_s: float = 30) -> dict[int, int]:
    """The mirror's lag per partition from its metrics port, once every partition has one."""
    import re
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        lags = {
            int(m[1]): int(m[2])
            for m in re.finditer(
                r'pidlease_mirror_lag_records\{.*partition="(\d+)"\} (-?\d+)', text
            )
        }
        if lags and all(v >= 0 for v in lags.values()):
            return lags
        assert time.monotonic() < deadline, text
        time.sleep(0.2)


def _wait_topic(cluster: LocalCluster, topic: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    with LeaseClient(cluster.coordinator_url) as c:
        while True:
            try:
                c.topic(topic, offsets=False)
                return
            except errors.UnknownTopicOrPartition:
                assert time.monotonic() < deadline, f"{topic} never appeared"
                time.sleep(0.2)


def _leader(cluster: LocalCluster, topic: str, partition: int) -> Any:
    with LeaseClient(cluster.coordinator_url) as c:
        ident = c.topic(topic, offsets=False).partition_states[partition].leader
    return cluster.server(int(ident))


def test_mirror_is_exactly_once_through_sigkills(two_clusters, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    src, dst = two_clusters
    print("source", src.coordinator_url, "target", dst.coordinator_url)
    records, kills = (200_000, 5) if LONG else (20_000, 3)
    rng = random.Random(int(os.environ.get("PIDLEASE_MIRROR_SEED", "7")))
    src.create_topic("orders", partitions=6, replication_factor=3)
    load_done = threading.Event()
    load_error: list[BaseException] = []

    def load() -> None:
        try:
            with Producer(src.coordinator_url, topic="orders", producer_name="loader") as p:
                # paced to span the kills: about 32 s (long form: about 60 s)
                chunk, pause = (1000, 0.3) if LONG else (500, 0.8)
                for start in range(0, records, chunk):
                    n = min(chunk, records - start)
                    keys = [b"k%d" % ((start + i) % 101) for i in range(n)]
                    p.send_batch([b"v-%d" % (start + i) for i in range(n)], keys=keys)
                    time.sleep(pause)
                p.flush()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            load_error.append(exc)
        finally:
            load_done.set()

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    log = tmp_path / "mirror.log"
    args = [
        "-m",
        "pidlease",
        "mirror",
        "--source",
        src.coordinator_url,
        "--target",
        dst.coordinator_url,
        "--topics",
        "orders",
        "--name",
        "dc1-to-dc2",
        "--progress-interval",
        "1",
    ]
    restarter: threading.Thread | None = None
    for k in range(kills):
        before = _resumes(log)
        proc = _spawn(args, log)
        _wait_started(log, before + 6, proc)  # every partition past its resume point
        time.sleep(rng.uniform(0.2, 2.5))
        if k == 0:
            # a leader of each cluster SIGKILLed under the running mirror, mid-load; they
            # come back in the background while the mirror's kills go on
            _wait_topic(dst, "orders")
            victims = [(src, _leader(src, "orders", 0)), (dst, _leader(dst, "orders", 3))]
            for cluster, svc in victims:
                cluster.kill(svc)
            down_s = rng.uniform(1.0, 3.0)

            def restart(victims: list[Any] = victims, down_s: float = down_s) -> None:
                time.sleep(down_s)
                for cluster, svc in victims:
                    cluster.start_service(svc)

            restarter = threading.Thread(target=restart, daemon=True)
            restarter.start()
            time.sleep(rng.uniform(0.5, 2.0))
        _kill(proc)
    assert restarter is not None
    restarter.join(120)
    assert not restarter.is_alive()
    loader.join(180)
    assert load_done.is_set() and not load_error, load_error
    final = subprocess.run(
        [sys.executable, *args, "--until-caught-up"],
        check=False,
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        timeout=240,
    )
    assert final.returncode == 0, final.stderr.decode()[-3000:] + log.read_text()[-3000:]
    assert b"caught up" in final.stdout
    assert check_mirror(src.coordinator_url, dst.coordinator_url, "orders", 6) == records
    resumed = log.read_text().count("resumes at offset") + final.stderr.count(b"resumes at offset")
    assert resumed > 0, "no mirror run was killed after it had copied something"


def test_chain_of_processors_is_the_function_of_its_input(make_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster(servers=1)
    url = cluster.coordinator_url
    n = workers.PARTITIONS
    cluster.create_topic("raw", partitions=n)
    cluster.create_topic("clean", partitions=n, dedup="monotonic")
    cluster.create_topic("enriched", partitions=n, dedup="monotonic")
    records = 3000
    rng = random.Random(11)
    log = tmp_path / "chain.log"
    stages = ["clean", "enrich"]
    worker = ["-m", "tests.integration.processor_workers"]

    def load() -> None:
        with Producer(url, topic="raw", producer_name="raw-loader") as p:
            for start in range(0, records, 250):
                p.send_batch(
                    [b"v-%d" % i for i in range(start, start + 250)],
                    keys=[b"k%d" % (i % 13) for i in range(start, start + 250)],
                )
                time.sleep(1.0)
            p.flush()

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    for _ in range(3):  # each stage SIGKILLed 3 times at a random point once it runs
        for s in stages:
            before = _resumes(log)
            procs[s] = _spawn([*worker, s, url], log)
            _wait_started(log, before + n, procs[s])
        time.sleep(rng.uniform(0.2, 2.0))
        for s in rng.sample(stages, 2):
            _kill(procs[s])
            time.sleep(rng.uniform(0.0, 0.5))
    loader.join(120)
    assert not loader.is_alive()
    for s in stages:
        _kill(procs[s])
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.integration.processor_workers",
                s,
                url,
                "--until-caught-up",
            ],
            check=False,
            cwd=ROOT,
            env=_env(),
            capture_output=True,
            timeout=180,
        )
        # the worker's --until-caught-up run: the stage before it is complete already
        assert done.returncode == 0, done.stderr.decode()[-3000:]
    for p_ in range(n):
        raw = _records(url, "raw", p_)
        want = [
            (k2, v2)
            for r in raw
            for k1, v1 in workers.clean(r)
            for k2, v2 in workers.enrich(_as_record(r, k1, v1))
        ]
        got = [(r.key, r.value) for r in _records(url, "enriched", p_)]
        assert got == want, f"partition {p_}: {len(got)} records against {len(want)} expected"
    assert sum(len(_records(url, "raw", q)) for q in range(n)) == records
    # the kills were not all before the first write: some restart resumed mid-stream
    assert "resumes at offset" in log.read_text()


def _rows(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with closing(sqlite3.connect(db, timeout=0.5)) as con:
            return int(con.execute("SELECT count(*) FROM events").fetchone()[0])
    except sqlite3.OperationalError:  # no table yet, or locked by the writer
        return 0


def _as_record(r: Any, key: bytes | None, value: bytes) -> Any:
    from dataclasses import replace

    return replace(r, key=key, value=value)


def test_sqlite_recipe_stores_each_record_once_through_sigkills(
    make_cluster, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster(servers=1)
    url = cluster.coordinator_url
    cluster.create_topic("events", partitions=workers.PARTITIONS)
    with Producer(url, topic="events", producer_name="ev") as p:
        p.send_batch([b"e-%d" % i for i in range(6000)], keys=[b"%d" % i for i in range(6000)])
        p.flush()
    db = tmp_path / "sink.db"
    log = tmp_path / "sqlite.log"
    rng = random.Random(3)
    args = ["-m", "tests.integration.processor_workers", "sqlite", url, "events", str(db)]
    # SIGKILLed 3 times once the table holds a random number of rows
    for threshold in sorted(rng.sample(range(100, 3000), 3)):
        proc = _spawn(args, log)
        deadline = time.monotonic() + 90
        while _rows(db) < threshold:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the consumer made no progress"
            time.sleep(0.02)
        _kill(proc)
    assert 0 < _rows(db) < 6000
    done = subprocess.run([sys.executable, *args], check=False, cwd=ROOT, env=_env(), timeout=180)
    assert done.returncode == 0
    with closing(sqlite3.connect(db)) as con:
        rows = {
            part: con.execute(
                "SELECT off, value FROM events WHERE part = ? ORDER BY rowid", (part,)
            ).fetchall()
            for part in range(workers.PARTITIONS)
        }
    for part in range(workers.PARTITIONS):
        got = rows[part]
        want = [(r.offset, r.value) for r in _records(url, "events", part)]
        assert got == want, f"partition {part}: {len(got)} rows against {len(want)} records"


RETENTION_ENV = {"PIDLEASE_RETENTION_CHECK_MS": "100", "PIDLEASE_FSYNC_INTERVAL_MS": "1"}


def test_input_deleted_by_retention_is_reported_not_skipped(make_cluster) -> None:  # type: ignore[no-untyped-def]
    """Retention moving past a processor's position is an error naming the lost offsets;
    nothing after them is processed (the mirror is this processor with fanout 1)."""
    cluster = make_cluster(servers=1, env=RETENTION_ENV)
    url = cluster.coordinator_url
    cluster.create_topic("src", partitions=1, segment_bytes=4096, retention_bytes=8192)
    cluster.create_topic("dst", partitions=1, dedup="monotonic")
    with Producer(url, topic="src", producer_name="w") as p:
        p.send_batch([b"first-%d" % i for i in range(20)]).result(30)

    def copy() -> Any:
        return Processor(url, "src", "dst", "copier", same_record, until_caught_up=True).run()

    copy()
    assert len(_records(url, "dst", 0)) == 20
    with Producer(url, topic="src", producer_name="w") as p:
        for i in range(40):
            p.send_batch([b"x" * 100 + b"-%d-%d" % (i, j) for j in range(10)]).result(30)
    deadline = time.monotonic() + 60
    while True:
        with Reader(url, "src", 0, start="earliest") as rd:
            first = next(iter(rd)).offset
        if first > 20:
            break
        assert time.monotonic() < deadline, "retention never deleted the first segment"
        time.sleep(0.2)
    with pytest.raises(errors.OffsetOutOfRange, match="records lost at the source") as info:
        copy()
    assert "offsets 20.." in str(info.value)
    assert len(_records(url, "dst", 0)) == 20  # nothing past the hole was copied


def test_a_takeover_fences_the_running_instance(make_cluster) -> None:  # type: ignore[no-untyped-def]
    """Instance B started on A's partitions (same name) takes their producer names over:
    A stops with ProducerFenced at its next write, B goes on, nothing is doubled."""
    cluster = make_cluster(servers=1)
    url = cluster.coordinator_url
    cluster.create_topic("in", partitions=2)
    cluster.create_topic("out", partitions=2, dedup="monotonic")
    feed = Producer(url, topic="in", producer_name="feed")
    sent = 0

    def send(n: int) -> None:
        nonlocal sent
        feed.send_batch([b"r-%d" % i for i in range(sent, sent + n)]).result(30)
        sent += n

    send(200)
    a = Processor(url, "in", "out", "copy", same_record, partitions=[0, 1])
    a_error: list[BaseException] = []

    def run_a() -> None:
        try:
            a.run()
        except BaseException as exc:  # noqa: BLE001 - checked below
            a_error.append(exc)

    ta = threading.Thread(target=run_a, daemon=True)
    ta.start()
    deadline = time.monotonic() + 60
    while sum(len(_records(url, "out", p)) for p in range(2)) < 200:
        assert time.monotonic() < deadline and ta.is_alive(), a_error
        time.sleep(0.2)
    b = Processor(url, "in", "out", "copy", same_record, instance=0, instances=1)
    tb = threading.Thread(target=b.run, daemon=True)
    tb.start()
    while ta.is_alive() and time.monotonic() < deadline:
        send(50)  # A learns it was fenced from its next write
        time.sleep(0.3)
    assert not ta.is_alive() and isinstance(a_error[0], errors.ProducerFenced), a_error
    send(100)
    feed.close()
    b.stop()  # B delivers what it took and returns
    tb.join(60)
    assert not tb.is_alive()
    Processor(url, "in", "out", "copy", same_record, until_caught_up=True).run()
    for p in range(2):
        want = [(r.key, r.value, r.timestamp_ms) for r in _records(url, "in", p)]
        assert [(r.key, r.value, r.timestamp_ms) for r in _records(url, "out", p)] == want


def test_mirror_across_tls_and_tokens_on_both_sides(  # type: ignore[no-untyped-def]
    zookeeper: ZooKeeperCluster, tmp_path: Path
) -> None:
    """Each cluster with TLS (its own CA) and API tokens of its own: the mirror reaches
    both with per-side --*-api-token and --*-tls-ca-file and copies exactly."""
    made: list[LocalCluster] = []
    try:
        for side, tokens in (
            ("src", "ops:admin:src-admin,app:producer:src-prod"),
            ("dst", "ops:admin:dst-admin"),
        ):
            hosts = f"{zookeeper.hosts}/mirror{os.getpid()}-{next(_ids)}-{side}"
            made.append(
                LocalCluster(
                    tmp_path / side,
                    servers=1,
                    zk_hosts=hosts,
                    tls=True,
                    env={"PIDLEASE_API_TOKENS": tokens},
                ).start()
            )
        src, dst = made
        assert src.coordinator_url.startswith("https://") and src.ca_file != dst.ca_file
        with LeaseClient(src.coordinator_url, api_token="src-admin", tls_ca_file=src.ca_file) as c:
            c.create_topic("orders", partitions=2)
        with Producer(
            src.coordinator_url, topic="orders", api_token="src-prod", tls_ca_file=src.ca_file
        ) as p:
            p.send_batch([b"s-%d" % i for i in range(500)], keys=[b"%d" % i for i in range(500)])
        argv = [
            "-m",
            "pidlease",
            "mirror",
            "--source",
            src.coordinator_url,
            "--target",
            dst.coordinator_url,
            "--topics",
            "orders",
            "--until-caught-up",
            "--source-tls-ca-file",
            str(src.ca_file),
            "--target-tls-ca-file",
            str(dst.ca_file),
        ]
        env = _env()
        env.update(PIDLEASE_SOURCE_API_TOKEN="src-prod", PIDLEASE_TARGET_API_TOKEN="dst-admin")
        run = subprocess.run(
            [sys.executable, *argv], check=False, cwd=ROOT, env=env, capture_output=True
        )
        assert run.returncode == 0, run.stderr.decode()[-3000:]
        # running without --until-caught-up: lag on the metrics port, SIGTERM ends it cleanly
        port = free_port()
        log = tmp_path / "follow.log"
        follow = argv[:-5] + argv[-4:]  # the same without --until-caught-up
        assert "--until-caught-up" not in follow
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, *follow, "--metrics-port", str(port)],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            _wait_started(log, 2, proc)
            lag = _scrape_lag(port)
            assert lag == {0: 0, 1: 0}, lag
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0, log.read_text()[-3000:]
            assert "stopped" in log.read_text()
        finally:
            _kill(proc)
        # without the target's token: refused, one clear line
        env.pop("PIDLEASE_TARGET_API_TOKEN")
        bad = subprocess.run(
            [sys.executable, *argv], check=False, cwd=ROOT, env=env, capture_output=True
        )
        assert bad.returncode == 1 and b"UNAUTHORIZED" in bad.stderr, bad.stderr[-2000:]
        for part in range(2):
            with Reader(
                src.coordinator_url, "orders", part, api_token="src-prod", tls_ca_file=src.ca_file
            ) as rd:
                want = [(r.key, r.value, r.timestamp_ms) for r in rd]
            with Reader(
                dst.coordinator_url, "orders", part, api_token="dst-admin", tls_ca_file=dst.ca_file
            ) as rd:
                got = [(r.key, r.value, r.timestamp_ms) for r in rd]
            assert got == want and want
    finally:
        for c in made:
            c.stop()
