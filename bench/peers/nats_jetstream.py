"""NATS JetStream (Debian ``nats-server``) with message deduplication by ``Nats-Msg-Id``.

Server: ``nats-server -c <conf>`` listening on 127.0.0.1 only, JetStream with file
storage under the run's directory. One stream per run (``BENCH<n>``, subjects
``bench<n>.>``), ``duplicate_window`` long enough to cover the whole run, so the resend
pass is judged by the server's dedup and not by a window running out.

Producer: ``nats-py`` async publish (``js.publish_async``: many publishes in flight, each
acknowledged by a PubAck; a re-sent id is acked with ``duplicate: true``), message id
``<producer>-<record>``, subject per producer.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.peers.process import ServerProcess, free_port
from bench.workload import LATENCY_EVERY, Outcome, clock, payload

DUPLICATE_WINDOW_S = 3600.0
MAX_PENDING = 4000  # nats-py's default bound on async publishes in flight


class System:
    name = "NATS JetStream (file, Nats-Msg-Id dedup)"
    key = "nats"
    producer = "bench.peers.nats_jetstream:produce"
    dedup = True

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.proc: ServerProcess | None = None
        self.runs = 0

    @staticmethod
    def available() -> str | None:
        """None when it can run, else why not."""
        if shutil.which("nats-server") is None:
            return "nats-server not installed (apt-get install nats-server)"
        try:
            import nats  # noqa: F401
        except ImportError:
            return "nats-py not installed (pip install nats-py)"
        return None

    def start(self) -> None:
        port = free_port()
        store = self.workdir / "nats-store"
        store.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "nats.conf"
        conf.write_text(
            f'listen: "127.0.0.1:{port}"\n'
            f'jetstream {{\n  store_dir: "{store}"\n  max_file_store: 20GB\n'
            f"  max_memory_store: 256MB\n}}\n"
        )
        self.proc = ServerProcess(
            "nats-server", ["nats-server", "-c", str(conf)], port, self.workdir / "nats.out"
        )
        self.proc.start()

    def server_pids(self) -> list[int]:
        assert self.proc is not None
        return [self.proc.pid]

    def prepare(self, value_bytes: int) -> dict[str, Any]:
        assert self.proc is not None
        self.runs += 1
        cfg = {
            "url": f"nats://127.0.0.1:{self.proc.port}",
            "stream": f"BENCH{self.runs}",
            "subject": f"bench{self.runs}",
        }
        asyncio.run(_create_stream(cfg))
        return cfg

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


async def _create_stream(cfg: dict[str, Any]) -> None:
    import nats
    from nats.js.api import StorageType, StreamConfig

    nc = await nats.connect(cfg["url"])
    try:
        js = nc.jetstream()
        await js.add_stream(
            StreamConfig(
                name=cfg["stream"],
                subjects=[cfg["subject"] + ".>"],
                storage=StorageType.FILE,
                duplicate_window=DUPLICATE_WINDOW_S,
            )
        )
    finally:
        await nc.close()


def _stamp(lat: list[float], t: float) -> Callable[[Any], None]:
    """A done-callback adding the latency since ``t`` to ``lat``."""
    return lambda _f: lat.append(clock() - t)


async def _produce(
    cfg: dict[str, Any], index: int, value_bytes: int, records: int, ready: Callable[[], Any]
) -> Outcome:
    import nats

    nc = await nats.connect(cfg["url"])
    js = nc.jetstream(publish_async_max_pending=MAX_PENDING)
    subject = f"{cfg['subject']}.p{index}"
    value = payload(value_bytes, index)
    out = Outcome(index, records)
    lat = out.latencies_s
    await asyncio.get_running_loop().run_in_executor(None, ready)
    cpu0 = time.process_time()
    out.started = clock()
    futs = []
    for j in range(records):
        t = clock() if j % LATENCY_EVERY == 0 else 0.0
        fut = await js.publish_async(subject, value, headers={"Nats-Msg-Id": f"{index}-{j}"})
        if t:
            fut.add_done_callback(_stamp(lat, t))
        futs.append(fut)
    await js.publish_async_completed()
    out.finished = clock()
    out.client_cpu_s = time.process_time() - cpu0
    for fut in futs:
        exc = fut.exception()
        if exc is not None:
            out.errors += 1
            out.error_sample = out.error_sample or repr(exc)
        elif fut.result().duplicate:
            out.duplicates += 1
        else:
            out.acked += 1
    await nc.close()
    return out


def produce(
    cfg: dict[str, Any],
    index: int,
    phase: str,
    value_bytes: int,
    records: int,
    ready: Callable[[], Any],
) -> Outcome:
    return asyncio.run(_produce(cfg, index, value_bytes, records, ready))
