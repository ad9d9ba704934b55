"""The contract's default (issue 26): ``Processor(url, input, output, name, fn)`` with no
extra flag; instances with the same name share the input partitions through the consumer
group named after ``name`` and take over a dead one's, fencing it. Real processes on a
real cluster, plaintext and TLS with API tokens (the group member authenticates to the
Kafka listener with the same ``api_token`` and ``tls_ca_file`` as the producers): two
instances split a 6-partition topic while it grows, one is SIGKILLed mid-stream, the other
takes its partitions over, and the whole output is read back and compared with the
function of the whole input."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pidlease import Producer, Reader
from pidlease.client.consumer import describe_group
from pidlease.client.lease_client import LeaseClient
from pidlease.client.processor import processor_group
from tests.integration import processor_workers as workers

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 6
RECORDS = 6000
ALL = list(range(PARTITIONS))
ADMIN, APP = "ops-admin-token", "app-producer-token"


def _shares(log: Path) -> list[list[int]]:
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


@pytest.mark.parametrize("secure", [False, True], ids=["plaintext", "tls-and-tokens"])
def test_same_name_instances_share_partitions_and_take_over_a_killed_one(
    make_cluster: Any, tmp_path: Path, secure: bool
) -> None:
    env_cluster = {"PIDLEASE_API_TOKENS": f"ops:admin:{ADMIN},app:producer:{APP}"}
    cluster = make_cluster(servers=1, tls=secure, env=env_cluster if secure else {})
    url = cluster.coordinator_url
    auth: dict[str, Any] = {}
    if secure:
        assert url.startswith("https://")
        auth = {"api_token": APP, "tls_ca_file": str(cluster.ca_file)}
    admin = {**auth, "api_token": ADMIN} if secure else {}
    with LeaseClient(url, **admin) as c:
        c.create_topic("raw6", partitions=PARTITIONS)
        c.create_topic("clean6", partitions=PARTITIONS, dedup="monotonic")
    loaded = threading.Event()
    enough = threading.Event()  # set once the kill and the takeover are behind us
    load_error: list[BaseException] = []
    sent = [0]

    def load() -> None:
        # at least RECORDS, and on until told (so the kill comes mid-stream however slow
        # the group is to settle); bounded
        try:
            with Producer(url, topic="raw6", producer_name="raw-loader", **auth) as p:
                for start in range(0, 100 * RECORDS, 300):
                    if start >= RECORDS and enough.is_set():
                        break
                    ids = range(start, start + 300)
                    p.send_batch([b"v-%d" % i for i in ids], keys=[b"k%d" % (i % 17) for i in ids])
                    sent[0] = start + 300
                    time.sleep(0.5)
                p.flush()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            load_error.append(exc)
        finally:
            loaded.set()

    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    for k in ("PIDLEASE_API_TOKEN", "PIDLEASE_TLS_CA_FILE"):
        env.pop(k, None)  # only what the command line says
    argv = [sys.executable, "-m", "tests.integration.processor_workers", "share", url]
    argv += ["raw6", "clean6", "cleaner"]
    if secure:
        argv += [APP, str(cluster.ca_file)]

    def spawn(log: Path) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)

    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    a = spawn(log_a)
    procs = [a]
    try:
        _wait("a alone has every partition", lambda: ALL in _shares(log_a), 90, log_a)
        loader = threading.Thread(target=load, daemon=True)
        loader.start()
        b = spawn(log_b)
        procs.append(b)
        _wait(
            "a and b share the partitions",
            lambda: (
                bool(_shares(log_a) and _shares(log_b))
                and bool(_shares(log_a)[-1])
                and bool(_shares(log_b)[-1])
                and sorted(_shares(log_a)[-1] + _shares(log_b)[-1]) == ALL
            ),
            90,
            log_a,
            log_b,
        )
        b_had = _shares(log_b)[-1]
        time.sleep(2.5)  # both process for a while, mid-load
        assert b.poll() is None and not loaded.is_set(), "the kill comes mid-stream"
        b.send_signal(signal.SIGKILL)
        b.wait(10)
        # b's session times out; a's producers lease b's names (fencing b's) and resume
        # from the output's last sequence ids
        _wait("a takes b's partitions over", lambda: _shares(log_a)[-1] == ALL, 60, log_a)
        # the group as `pidlease groups describe` shows it, through the same doors
        d = describe_group(url, processor_group("cleaner"), **auth)
        assert [m["partitions"] for m in d["members"]] == [{"raw6": ALL}], d
        enough.set()
        loader.join(120)
        assert loaded.is_set() and not load_error, load_error
        assert sent[0] >= RECORDS

        def outputs() -> int:
            n = 0
            for p in ALL:
                with Reader(url, "clean6", p, **auth) as rd:
                    n += sum(1 for _ in rd)
            return n

        _wait("a processes the whole input", lambda: outputs() >= 2 * sent[0], 120, log_a)
        time.sleep(1)  # nothing more may come
    finally:
        enough.set()
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
    total = 0
    for p in ALL:
        with Reader(url, "raw6", p, **auth) as rd:
            raw = list(rd)
        with Reader(url, "clean6", p, **auth) as rd:
            got = [(r.key, r.value) for r in rd]
        want = [out for r in raw for out in workers.clean(r)]
        assert got == want, f"partition {p}: {len(got)} outputs against {len(want)} expected"
        total += len(raw)
    assert total == sent[0]
    # the partitions b held were resumed by a under the same names, from where b stopped
    text = log_a.read_text()
    resumed = {int(p) for p in re.findall(r"raw6 partition (\d+) resumes at offset", text)}
    assert set(b_had) <= resumed, (b_had, resumed)
