"""A Spark standalone cluster from the installed PySpark, for tests and benchmarks.

A master on 127.0.0.1 and one one-core worker per host in ``HOSTS`` (127.0.0.1 and
127.0.0.2: Spark runs a speculative copy only on another host than the original's), each
started with ``spark-class`` in its own process group, with ``--work-dir`` in a given
directory (without it a worker writes into site-packages) and web UI ports picked free
(other suites may run beside). Executors run ``PYSPARK_PYTHON`` = this interpreter and
import pidlease from ``pythonpath`` (by default the checkout this module belongs to).

Only the standard library and the location of pyspark are used: the benchmark loads
this file by path when it runs against an older checkout (a before/after comparison,
from before the data source moved here from the top-level ``pipeline``), so it must not
import anything else from ``pidlease``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

HOSTS = ("127.0.0.1", "127.0.0.2")
START_TIMEOUT_S = 180.0  # JVMs start slowly on 2 cores shared with other suites
REPO = Path(__file__).resolve().parents[2]  # the checkout executors import by default


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def executor_env(pythonpath: str | None = None) -> dict[str, str]:
    """This process's environment plus what Spark's JVMs and Python workers need."""
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(spark_home()),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PYTHONPATH=pythonpath if pythonpath is not None else str(REPO),
    )
    return env


class Standalone:
    """A Spark standalone master and one worker per host in ``hosts``."""

    def __init__(
        self,
        work: Path,
        *,
        hosts: tuple[str, ...] = HOSTS,
        cores: int = 1,
        memory: str = "1g",
        pythonpath: str | None = None,
    ) -> None:
        self.work = work
        self.hosts = hosts
        self.cores = cores
        self.memory = memory
        self.pythonpath = pythonpath
        self.port = free_port()
        self.ui_port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.workers: list[subprocess.Popen[bytes]] = []

    def _spawn(self, name: str, args: list[str], local_ip: str) -> subprocess.Popen[bytes]:
        env = executor_env(self.pythonpath)
        env["SPARK_LOCAL_IP"] = local_ip
        with open(self.work / f"{name}.log", "wb") as log:  # the child keeps its own fd
            proc = subprocess.Popen(  # noqa: S603 - spark-class of the installed PySpark
                [str(spark_home() / "bin" / "spark-class"), *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own group: stop() takes the executors too
            )
        self.procs.append(proc)
        return proc

    @staticmethod
    def _ui(port: int) -> tuple[str, str]:
        return ("--webui-port", str(port))  # not 8080/8081: other suites may run beside

    def start(self) -> Standalone:
        master = "org.apache.spark.deploy.master.Master"
        self._spawn(
            "master",
            [master, "--host", "127.0.0.1", "--port", str(self.port), *self._ui(self.ui_port)],
            "127.0.0.1",
        )
        for i, host in enumerate(self.hosts):
            work_dir = self.work / f"worker{i}"
            work_dir.mkdir()
            worker = self._spawn(
                f"worker{i}",
                [
                    "org.apache.spark.deploy.worker.Worker",
                    *("--host", host, "--cores", str(self.cores), "--memory", self.memory),
                    *("--work-dir", str(work_dir), *self._ui(free_port(host)), self.url),
                ],
                host,
            )
            self.workers.append(worker)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if len(self.alive_workers()) == len(self.hosts):
                return self
            time.sleep(1)
        self.stop()
        raise AssertionError(f"workers did not register in {START_TIMEOUT_S}s:\n{self.logs()}")

    def alive_workers(self) -> list[str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
                state = json.load(r)
        except OSError:
            return []
        return [w["host"] for w in state.get("workers", []) if w.get("state") == "ALIVE"]

    def logs(self, lines: int = 40) -> str:
        out = []
        for f in sorted(self.work.glob("*.log")):
            out.append(
                f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-lines:])
            )
        return "\n".join(out)

    def stop(self) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=20)


def wait_for_executors(
    spark: Any, hosts: tuple[str, ...], timeout_s: float = START_TIMEOUT_S
) -> None:
    """Until an executor runs on every host: the driver's block managers (one per
    executor, and the driver's own, on 127.0.0.1 too)."""
    deadline = time.monotonic() + timeout_s
    seen: list[str] = []
    while time.monotonic() < deadline:
        status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus()  # noqa: SLF001 - no public API
        keys = status.keys().iterator()
        seen = []
        while keys.hasNext():
            seen.append(str(keys.next()).rsplit(":", 1)[0])
        if set(hosts) <= set(seen) and len(seen) > len(hosts):
            return
        time.sleep(1)
    raise AssertionError(f"block managers on {sorted(seen)}, wanted an executor on each of {hosts}")
