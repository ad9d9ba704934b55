"""Redis Streams (Debian ``redis-server``), append-only file fsynced every second, in two
variants:

- ``function``: the fair equivalent of pidlease's append rule. A Redis function
  (``FUNCTION LOAD``, Lua) keeps per producer a hash with its generation and highwater and,
  atomically, fences an older generation, answers DUP for a sequence at or below the
  highwater, refuses a gap, and otherwise ``XADD``s the record (with its producer id and
  sequence, as pidlease's log carries them) and raises the highwater. One ``FCALL`` per
  record, pipelined.
- ``xadd``: raw ``XADD`` with explicit ids ``0-<sequence+1>`` on one stream per producer.
  Redis refuses an id at or below the stream's top, which makes a resend fail, but it
  accepts gaps and has no generation: it is dedup only for a single writer that never
  loses its place.

Producer: redis-py (with hiredis when installed), one pipeline of ``PIPELINE`` commands
at a time (send all, read all answers), as a redis-py user would batch.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.peers.process import ServerProcess, free_port
from bench.workload import LATENCY_EVERY, Outcome, clock, payload

PIPELINE = 1000

LIBRARY = """#!lua name=pidlease_bench
-- KEYS[1] stream, KEYS[2] the producer's state hash; ARGV: pid, generation, sequence, value
local function append(keys, args)
  local gen = tonumber(args[2])
  local seq = tonumber(args[3])
  local st = redis.call('HMGET', keys[2], 'gen', 'hw')
  local sgen = tonumber(st[1]) or -1
  local hw = tonumber(st[2]) or -1
  if gen < sgen then return 'FENCED' end
  if seq <= hw then return 'DUP' end
  if seq ~= hw + 1 then return 'OUT_OF_ORDER' end
  redis.call('XADD', keys[1], '*', 'pid', args[1], 'gen', args[2], 'seq', args[3], 'v', args[4])
  redis.call('HSET', keys[2], 'gen', gen, 'hw', seq)
  return 'OK'
end
redis.register_function('pl_append', append)
"""


class System:
    key = "redis"
    producer = "bench.peers.redis_streams:produce"
    dedup = True

    def __init__(self, workdir: Path, variant: str) -> None:
        assert variant in ("function", "xadd")
        self.workdir = workdir
        self.variant = variant
        self.key = f"redis-{variant}"
        self.name = (
            "Redis Streams, function (highwater + generation)"
            if variant == "function"
            else "Redis Streams, raw XADD with explicit ids"
        )
        self.proc: ServerProcess | None = None
        self.runs = 0

    @staticmethod
    def available() -> str | None:
        if shutil.which("redis-server") is None:
            return "redis-server not installed (apt-get install redis-server)"
        try:
            import redis  # noqa: F401
        except ImportError:
            return "redis not installed (pip install redis)"
        return None

    def start(self) -> None:
        port = free_port()
        d = self.workdir / f"redis-{self.variant}"
        d.mkdir(parents=True, exist_ok=True)
        self.proc = ServerProcess(
            f"redis-server ({self.variant})",
            [
                "redis-server",
                "--bind",
                "127.0.0.1",
                "--port",
                str(port),
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                "--dir",
                str(d),
                "--daemonize",
                "no",
                "--protected-mode",
                "yes",
            ],
            port,
            d / "redis.out",
        )
        self.proc.start()
        if self.variant == "function":
            import redis

            r = redis.Redis(host="127.0.0.1", port=port)
            r.function_load(LIBRARY, replace=True)
            r.close()

    def server_pids(self) -> list[int]:
        assert self.proc is not None
        return [self.proc.pid]

    def prepare(self, value_bytes: int) -> dict[str, Any]:
        assert self.proc is not None
        self.runs += 1
        return {"port": self.proc.port, "variant": self.variant, "run": self.runs}

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


def produce(
    cfg: dict[str, Any],
    index: int,
    phase: str,
    value_bytes: int,
    records: int,
    ready: Callable[[], Any],
) -> Outcome:
    import redis

    r = redis.Redis(host="127.0.0.1", port=int(cfg["port"]))
    r.ping()
    value = payload(value_bytes, index)
    function = cfg["variant"] == "function"
    run = cfg["run"]
    stream = f"bench{run}" if function else f"bench{run}:p{index}"
    state = f"bench{run}:state:{index}"
    pid = str(index + 1)
    out = Outcome(index, records)
    ready()
    cpu0 = time.process_time()
    out.started = clock()
    for start in range(0, records, PIPELINE):
        pipe = r.pipeline(transaction=False)
        stamps = []
        for j in range(start, min(records, start + PIPELINE)):
            if j % LATENCY_EVERY == 0:
                stamps.append(clock())
            if function:
                pipe.fcall("pl_append", 2, stream, state, pid, "1", j, value)
            else:
                pipe.xadd(stream, {"v": value}, id=f"0-{j + 1}")
        answers = pipe.execute(raise_on_error=False)
        now = clock()
        out.latencies_s.extend(now - t for t in stamps)
        for a in answers:
            if isinstance(a, Exception):
                if "equal or smaller" in str(a):
                    out.duplicates += 1  # raw XADD: the id is at or below the top
                else:
                    out.errors += 1
                    out.error_sample = out.error_sample or str(a)
            elif not function or a == b"OK":
                out.acked += 1
            elif a == b"DUP":
                out.duplicates += 1
            else:
                out.errors += 1
                out.error_sample = out.error_sample or str(a)
    out.finished = clock()
    out.client_cpu_s = time.process_time() - cpu0
    r.close()
    return out
