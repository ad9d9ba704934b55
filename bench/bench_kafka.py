"""confluent-kafka (librdkafka, idempotent, acks=all) vs the pidlease SDK producing 100-byte
records to one real partition server, in the same run: records/s and the server's CPU per
record (all its threads, from /proc).

    PYTHONPATH=. python bench/bench_kafka.py [--records 200000] [--rounds 2]

One LocalCluster (its own ZooKeeper, one coordinator, one partition server, fsync on the
default interval), one 1-partition topic per client kind; the two kinds alternate each
round so drift in a shared machine's load falls on both alike. The same clients beside the
ceiling (a bare asyncio CRC-and-append server) in one run, with ratios, are systems of
``bench.compare``: ``python -m bench.compare --systems ceiling,pidlease,pidlease-batch,
confluent-kafka,aiokafka --sizes 100 --skip-alone --no-docs``; the librdkafka settings
are compare's ``KAFKA_PRODUCER_SETTINGS`` in both.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable

from bench.compare import KAFKA_PRODUCER_SETTINGS
from bench.procstats import cpu_seconds
from pidlease.client.producer import Producer as SdkProducer
from pidlease.testing.devcluster import LocalCluster

VALUE = b"x" * 100


def kafka_run(bootstrap: str, topic: str, n: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, **KAFKA_PRODUCER_SETTINGS})
    failed: list[object] = []

    def report(err: object, _msg: object) -> None:
        if err is not None:
            failed.append(err)

    for _ in range(n):
        while True:
            try:
                p.produce(topic, VALUE, partition=0, on_delivery=report)
                break
            except BufferError:
                p.poll(0.01)
    assert p.flush(300) == 0 and not failed, failed[:3]


def sdk_run(url: str, topic: str, n: int) -> None:
    with SdkProducer(url, topic=topic) as p:
        futs = [p.send(VALUE, partition=0) for _ in range(n)]
        p.flush()
        futs[-1].result(300)


def measure(server_pid: int, fn: Callable[[], None], n: int) -> tuple[float, float]:
    """(records/s, server CPU microseconds per record)."""
    cpu0, t0 = cpu_seconds(server_pid), time.perf_counter()
    fn()
    wall, cpu = time.perf_counter() - t0, cpu_seconds(server_pid) - cpu0
    return n / wall, cpu / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    n = args.records
    with tempfile.TemporaryDirectory(prefix="bench-kafka-") as d:
        c = LocalCluster(d, servers=1).start()
        try:
            c.create_topic("via-kafka", partitions=1)
            c.create_topic("via-sdk", partitions=1)
            proc = c.servers[0].proc
            assert proc is not None
            runs: dict[str, Callable[[], None]] = {
                "confluent-kafka": lambda: kafka_run(c.kafka_bootstrap, "via-kafka", n),
                "pidlease SDK": lambda: sdk_run(c.coordinator_url, "via-sdk", n),
            }
            got: dict[str, list[tuple[float, float]]] = {k: [] for k in runs}
            for r in range(args.rounds):
                order = list(runs) if r % 2 == 0 else list(reversed(runs))
                for name in order:
                    rate, cpu_us = measure(proc.pid, runs[name], n)
                    got[name].append((rate, cpu_us))
                    print(
                        f"round {r + 1} {name}: {rate:,.0f} records/s, "
                        f"{cpu_us:.2f} us server CPU/record",
                        flush=True,
                    )
        finally:
            c.stop()
    print(f"\n{n:,} records of 100 B per run, {args.rounds} rounds, median:")
    print("| client | records/s | server CPU us/record |")
    print("| --- | ---: | ---: |")
    for name, xs in got.items():
        rate = statistics.median(x[0] for x in xs)
        cpu = statistics.median(x[1] for x in xs)
        print(f"| {name} | {rate:,.0f} | {cpu:.2f} |")


if __name__ == "__main__":
    main()
