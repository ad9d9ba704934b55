"""Benchmarks of pidlease, and of the systems people pick instead, on one machine.

``python -m bench.compare`` is the one command: it starts everything it needs on
127.0.0.1 (ZooKeeper, a coordinator and a partition server; NATS JetStream; Redis; a bare
"ceiling" append server), runs the same workload against each side by side, prints the
table and writes ``docs/benchmarks.md`` and ``docs/img/throughput.png``.

Layout: ``workload.py`` (what a producer does and how results are summed up),
``procstats.py`` (CPU seconds and peak RSS of server processes), ``runner.py`` (producers
as separate processes started together), ``peers/`` (one module per system: how to start
it and what one producer does against it), ``pidlease_alone.py`` (figures only pidlease
has: dedup overhead, leases, replay, memory per PID, restart pause), ``report.py`` (table,
docs, chart). The older single-purpose scripts (``bench_append.py``, ``bench_lease.py``,
``bench_recovery.py``) still run on their own; ``pidlease_alone`` reuses them.
"""
