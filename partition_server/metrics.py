"""What one partition server tells operators: append outcome counters (fenced appends,
duplicates, out-of-order ...), the append-latency histogram, gauges read at scrape time
(tracked PIDs and their estimated memory, snapshot age, replication lag), a bounded feed
of recent fenced / duplicate / fence events, and the Prometheus text all of it renders to
(served by ``metrics_listener.py`` on ``metrics_port``).

Written by hand, like the coordinator's: a dozen series do not justify a dependency, and
the hot path must stay cheap (one attribute increment per outcome; events are appended to
a ``deque`` with a fixed length). Everything runs on the server's event loop, so there are
no locks. The coordinator reads ``summary()`` through METADATA (it already speaks the
binary protocol to every server), so the dashboard needs no metrics port to find.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import logging
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

log = logging.getLogger("partition_server.metrics")

# Seconds from receiving a PRODUCE to its durable ack: fsync (group commit every few ms) and,
# with R>1, the followers' next fetch; seconds-long tails mean a sick disk or replica.
APPEND_LATENCY_BUCKETS_S = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
EVENTS_KEPT = 200  # recent events held for the dashboard (bounded memory)
SUMMARY_EVENTS_MAX = 50  # how many of them one METADATA answer carries

# Refusals that the dashboard lists one by one; the others are only counted.
EVENT_KINDS = ("fenced_append", "duplicate", "fence")

LabelValues = tuple[str, ...]
GaugeValue = float | Mapping[LabelValues, float]


def escape_label(value: str) -> str:
    """Prometheus label escaping: backslash, double quote and newline."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_sample(name: str, labels: Iterable[tuple[str, str]], value: float) -> str:
    pairs = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels)
    num = (
        repr(float(value))
        if isinstance(value, float) and not value.is_integer()
        else str(int(value))
    )
    return f"{name}{{{pairs}}} {num}" if pairs else f"{name} {num}"


class Histogram:
    """Cumulative buckets in Prometheus' sense, with sum and count."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def render(self, name: str) -> list[str]:
        out = []
        running = 0
        for le, n in zip(self.buckets, self.counts, strict=False):
            running += n
            out.append(f'{name}_bucket{{le="{le}"}} {running}')
        out.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        out.append(f"{name}_sum {self.total:.6f}")
        out.append(f"{name}_count {self.count}")
        return out


# name -> (attribute on ServerMetrics, help). Counters of append outcomes, in render order.
_COUNTERS = (
    (
        "pidlease_server_appended_batches_total",
        "appended_batches",
        "Idempotent and plain batches appended to a leader's log.",
    ),
    ("pidlease_server_appended_records_total", "appended_records", "Records in those batches."),
    (
        "pidlease_server_fenced_appends_total",
        "fenced_appends",
        "Batches refused FENCED: a generation older than the partition's (a zombie producer).",
    ),
    (
        "pidlease_server_duplicates_total",
        "duplicates",
        "Batches answered DUPLICATE (a retry of something already durable; not appended).",
    ),
    (
        "pidlease_server_out_of_order_total",
        "out_of_order",
        "Batches refused OUT_OF_ORDER_SEQUENCE (a gap or a straddle).",
    ),
    (
        "pidlease_server_unknown_pid_total",
        "unknown_pid",
        "Batches refused UNKNOWN_PID (state expired or never leased).",
    ),
    (
        "pidlease_server_sequence_unknown_total",
        "sequence_unknown",
        "Batches answered SEQUENCE_UNKNOWN (retry of a batch still in flight).",
    ),
    (
        "pidlease_server_fences_total",
        "fences",
        "Fence records written for a takeover's new generation.",
    ),
)

# Outcome names (producer_state.Outcome values) -> counter attribute.
_OUTCOME_ATTR = {
    "FENCED": "fenced_appends",
    "DUPLICATE": "duplicates",
    "OUT_OF_ORDER_SEQUENCE": "out_of_order",
    "UNKNOWN_PID": "unknown_pid",
    "SEQUENCE_UNKNOWN": "sequence_unknown",
}
_OUTCOME_EVENT = {"FENCED": "fenced_append", "DUPLICATE": "duplicate"}


class ServerMetrics:
    """The counters and the event feed of one server; gauges are callbacks registered by
    whoever owns the state (the log manager), read only when someone scrapes."""

    def __init__(
        self,
        server_id: int,
        *,
        clock_ms: Callable[[], int] | None = None,
        events_kept: int = EVENTS_KEPT,
    ) -> None:
        self.server_id = server_id
        self.clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        # Events are keyed by (boot, seq) so a reader can tell a restart from old news.
        self.boot_ms = self.clock_ms()
        self.appended_batches = 0
        self.appended_records = 0
        self.fenced_appends = 0
        self.duplicates = 0
        self.out_of_order = 0
        self.unknown_pid = 0
        self.sequence_unknown = 0
        self.fences = 0
        self.append_latency = Histogram(APPEND_LATENCY_BUCKETS_S)
        self.events: deque[dict[str, Any]] = deque(maxlen=events_kept)
        self._seq = itertools.count(1)
        # name -> (help, type, callback); a callback returns a number or {labels: number}.
        self._gauges: dict[str, tuple[str, str, tuple[str, ...], Callable[[], GaugeValue]]] = {}

    # -- the hot path ----------------------------------------------------------------------
    def appended(
        self,
        records: int,
        started_s: float | None = None,
        durable: asyncio.Future[Any] | None = None,
    ) -> None:
        """One batch appended; with ``durable``, its latency is observed when acked."""
        self.appended_batches += 1
        self.appended_records += records
        if durable is not None and started_s is not None:
            observe = self.append_latency.observe

            def done(fut: asyncio.Future[Any]) -> None:
                # A batch that fails (leadership lost, shutdown) was never acked: not timed.
                if not fut.cancelled() and fut.exception() is None:
                    observe(time.perf_counter() - started_s)

            durable.add_done_callback(done)

    def refused(
        self,
        outcome: str,
        topic: str,
        partition: int,
        pid: int,
        generation: int,
        base_sequence: int,
        count: int,
    ) -> None:
        """A batch not appended, by its outcome name (``Outcome.value``)."""
        attr = _OUTCOME_ATTR.get(outcome)
        if attr is None:
            return
        setattr(self, attr, getattr(self, attr) + 1)
        kind = _OUTCOME_EVENT.get(outcome)
        if kind is not None:
            self._event(
                kind, topic, partition, pid, generation, base_sequence=base_sequence, count=count
            )

    def fenced(self, topic: str, partition: int, pid: int, generation: int) -> None:
        """A fence record was written: a takeover raised ``pid`` to ``generation``."""
        self.fences += 1
        self._event("fence", topic, partition, pid, generation)

    def _event(
        self, kind: str, topic: str, partition: int, pid: int, generation: int, **extra: int
    ) -> None:
        self.events.append(
            {
                "id": f"{self.server_id}:{self.boot_ms}:{next(self._seq)}",
                "kind": kind,
                "time_ms": self.clock_ms(),
                "server_id": self.server_id,
                "topic": topic,
                "partition": partition,
                "pid": pid,
                "generation": generation,
                **extra,
            }
        )

    # -- gauges ----------------------------------------------------------------------------
    def gauge(
        self,
        name: str,
        help_text: str,
        fn: Callable[[], GaugeValue],
        *,
        labels: tuple[str, ...] = (),
        kind: str = "gauge",
    ) -> None:
        """Register a value read at scrape time; ``labels`` names the keys of a dict result.
        ``kind`` is "counter" for totals kept elsewhere (e.g. PIDs expired)."""
        self._gauges[name] = (help_text, kind, labels, fn)

    def read_gauge(self, name: str) -> GaugeValue:
        return self._gauges[name][3]()

    # -- output ----------------------------------------------------------------------------
    def render(self) -> str:
        lines: list[str] = []
        for name, attr, help_text in _COUNTERS:
            lines += [
                f"# HELP {name} {help_text}",
                f"# TYPE {name} counter",
                f"{name} {getattr(self, attr)}",
            ]
        name = "pidlease_server_append_latency_seconds"
        lines += [
            f"# HELP {name} Time from receiving a PRODUCE to its durable ack.",
            f"# TYPE {name} histogram",
            *self.append_latency.render(name),
        ]
        for name, (help_text, kind, labels, fn) in sorted(self._gauges.items()):
            try:
                value = fn()
            except Exception:
                log.exception("gauge %s failed", name)
                continue
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            if isinstance(value, Mapping):
                for key, v in sorted(value.items()):
                    lines.append(format_sample(name, zip(labels, key, strict=True), v))
            else:
                lines.append(format_sample(name, (), value))
        return "\n".join(lines) + "\n"

    def summary(self) -> dict[str, Any]:
        """Figures and recent events for the coordinator's dashboard (via METADATA)."""
        out: dict[str, Any] = {attr: getattr(self, attr) for _, attr, _ in _COUNTERS}
        for name in (
            "pidlease_server_tracked_pids",
            "pidlease_server_producer_state_bytes",
            "process_resident_memory_bytes",
            "pidlease_server_snapshot_age_seconds",
        ):
            if name in self._gauges:
                try:
                    value = self._gauges[name][3]()
                except Exception:  # the dashboard shows what it can; render() logs it
                    log.debug("gauge %s failed", name, exc_info=True)
                    continue
                if not isinstance(value, Mapping):
                    out[name.removeprefix("pidlease_server_")] = value
        out["events"] = list(self.events)[-SUMMARY_EVENTS_MAX:]
        return out


def estimate_state_bytes(table: Any, sample_max: int = 64) -> int:
    """Estimated bytes held by a producer-state table: its columns exactly, its PID dict and
    side structures from a sample of up to ``sample_max`` entries (measuring a million every
    scrape would stall the loop). A plain mapping of PID -> object (older tables, stand-ins)
    is estimated from a sample of its entries."""
    if hasattr(table, "memory_bytes"):
        return int(table.memory_bytes(sample_max))
    entries: Mapping[int, Any] = table
    n = len(entries)
    total = sys.getsizeof(entries)
    if n == 0:
        return total
    sampled = 0
    per = 0
    for pid, entry in itertools.islice(entries.items(), sample_max):
        sampled += 1
        per += sys.getsizeof(pid) + sys.getsizeof(entry)
        for slot in getattr(type(entry), "__slots__", ()):
            value = getattr(entry, slot, None)
            # Small ints and None are shared by the interpreter; lists hold tuples.
            if (isinstance(value, int) and -5 <= value <= 256) or value is None:
                continue
            per += sys.getsizeof(value)
            if isinstance(value, list):
                per += sum(sys.getsizeof(x) for x in value)
    return total + n * (per // sampled)


def _role_name(p: Any) -> str:
    """A partition's role as its label ("leader", "follower", "none"): ``Partition.role``
    is a ``Role``; a fake partition may carry the name."""
    role = p.role
    return str(getattr(role, "value", role))


def watch_log_manager(m: ServerMetrics, log_manager: Any) -> None:
    """Register the gauges read from a ``LogManager`` at scrape time: tracked PIDs and their
    memory, partitions by role, snapshot age, PID expiry, (leaders of replicated
    partitions) each follower's lag, and each hosted partition's log: size, start, end,
    segments, and what retention deleted. Duck-typed, so a fake log manager can stand in."""

    def parts() -> list[Any]:
        return [p for p in log_manager.partitions.values() if getattr(p, "hosted", True)]

    def state_bytes() -> int:
        ps = list(log_manager.partitions.values())
        # Sampling is bounded across the server, not per partition: ~4k entries a scrape.
        per = max(2, min(64, 4096 // max(1, len(ps))))
        return sum(estimate_state_bytes(p.state, per) for p in ps)

    def by_role() -> dict[LabelValues, float]:
        out: dict[LabelValues, float] = {("leader",): 0, ("follower",): 0}
        for p in parts():
            role = _role_name(p)
            out[(role,)] = out.get((role,), 0) + 1
        return out

    def leaders_with_followers() -> list[Any]:
        return [
            p for p in parts() if _role_name(p) == "leader" and getattr(p, "isr", None) is not None
        ]

    def lag(field: str) -> dict[LabelValues, float]:
        out: dict[LabelValues, float] = {}
        for p in leaders_with_followers():
            for replica, info in p.isr.lag_report(p.isr_clock_ms()).items():
                key = (p.topic, str(p.partition), str(replica))
                if field == "offsets":
                    # -1: the follower has not fetched in this leadership yet.
                    end = info["end_offset"]
                    out[key] = p.log.next_offset - end if end >= 0 else -1
                else:
                    out[key] = info["ms_since_caught_up"] / 1000
        return out

    def under_replicated() -> int:
        return sum(1 for p in leaders_with_followers() if len(p.isr.isr) < len(p.isr.replicas))

    def under_min_isr() -> int:
        return sum(1 for p in leaders_with_followers() if not p.isr.accepts_writes())

    def per_partition(fn: Callable[[Any], float]) -> Callable[[], dict[LabelValues, float]]:
        # Followers too: retention runs on every replica and each one's disk fills alone.
        return lambda: {(p.topic, str(p.partition)): fn(p) for p in parts()}

    def deleted(index: int) -> Callable[[], dict[LabelValues, float]]:
        # Hosted partitions only (the cardinality of the other per-partition series); the
        # broker keeps the totals of one that leaves, so a return resumes the counter.
        def one(p: Any) -> float:
            by_key = getattr(log_manager, "deleted_by_partition", {})
            return float(by_key.get((p.topic, p.partition), (0, 0))[index])

        return per_partition(one)

    def isr_changes(index: int) -> Callable[[], dict[LabelValues, float]]:
        # Per hosted partition, 0 until one happens; a follower's count stays from when it
        # led (the replica manager keeps them across leaderships).
        def one(p: Any) -> float:
            replicas = getattr(log_manager, "replicas", None)
            by_key = getattr(replicas, "isr_changes", {})
            return float(by_key.get((p.topic, p.partition), (0, 0))[index])

        return per_partition(one)

    g = m.gauge
    g(
        "pidlease_server_tracked_pids",
        "PIDs with producer state, all partitions on this server.",
        lambda: sum(len(p.state) for p in log_manager.partitions.values()),
    )
    g(
        "pidlease_server_tracked_pids_by_partition",
        "PIDs with producer state per hosted partition.",
        lambda: {(p.topic, str(p.partition)): len(p.state) for p in parts()},
        labels=("topic", "partition"),
    )
    g(
        "pidlease_server_producer_state_bytes",
        "Estimated memory of the producer-state tables (sampled; PID churn shows here first).",
        state_bytes,
    )
    g("process_resident_memory_bytes", "Resident memory of this process.", resident_memory_bytes)
    g("pidlease_server_partitions", "Hosted partitions by role.", by_role, labels=("role",))
    g(
        "pidlease_server_snapshot_age_seconds",
        "Seconds since the last producer-state snapshot (since start when none yet): recovery "
        "replays the log written since then.",
        # The log manager's own snapshot clock (test fakes mirror the name).
        lambda: max(0, log_manager.clock_ms() - log_manager._last_snapshot_ms) / 1000,  # noqa: SLF001
    )
    g(
        "pidlease_server_snapshots_total",
        "Producer-state snapshots written.",
        lambda: log_manager.snapshots_taken,
        kind="counter",
    )
    g(
        "pidlease_server_pids_expired_total",
        "PIDs dropped after pid_expire_ms unused.",
        lambda: sum(p.state.expired_total for p in log_manager.partitions.values()),
        kind="counter",
    )
    g(
        "pidlease_server_pids_evicted_total",
        "PIDs dropped to make room for a new one because a partition hit "
        "tracked_pids_max_per_partition (only PIDs idle for pid_evict_idle_min_ms; monotonic "
        "topics: only expired ones).",
        lambda: sum(p.state.evicted_total for p in log_manager.partitions.values()),
        kind="counter",
    )
    g(
        "pidlease_server_pid_limit_refusals_total",
        "First appends of new PIDs refused TOO_MANY_PIDS: the partition tracked "
        "tracked_pids_max_per_partition PIDs and none could be evicted (too many distinct "
        "producers; see docs/reliability.md, Tracked-PID limit).",
        lambda: sum(getattr(p.state, "refused_total", 0) for p in log_manager.partitions.values()),
        kind="counter",
    )
    g(
        "pidlease_server_move_throttled_bytes_total",
        "Bytes this server, as leader, sent to replicas catching up for a move, under the "
        "move throttle (move_fetch_bytes_per_s; partition_server/move_throttle.py).",
        lambda: getattr(
            getattr(getattr(log_manager, "replicas", None), "move_throttle", None),
            "throttled_bytes",
            0,
        ),
        kind="counter",
    )
    g(
        "pidlease_server_replica_lag_offsets",
        "Per follower of a partition this server leads: offsets behind the leader's log end "
        "(-1 before its first fetch).",
        lambda: lag("offsets"),
        labels=("topic", "partition", "replica"),
    )
    g(
        "pidlease_server_replica_lag_seconds",
        "Per follower of a partition this server leads: seconds since it was last caught up.",
        lambda: lag("seconds"),
        labels=("topic", "partition", "replica"),
    )
    g(
        "pidlease_server_under_replicated_partitions",
        "Partitions this server leads whose in-sync set is smaller than their replica set.",
        under_replicated,
    )
    g(
        "pidlease_server_under_min_isr_partitions",
        "Partitions this server leads whose in-sync set is below their topic's "
        "min_insync_replicas: they refuse produces NOT_ENOUGH_REPLICAS.",
        under_min_isr,
    )
    g(
        "pidlease_server_min_insync_refusals_total",
        "Produces and fences refused NOT_ENOUGH_REPLICAS (the in-sync set below the topic's "
        "min_insync_replicas), on the partitions this server hosts.",
        lambda: sum(getattr(p, "min_insync_refusals", 0) for p in log_manager.partitions.values()),
        kind="counter",
    )
    tp = ("topic", "partition")
    g(
        "pidlease_server_isr_shrinks_total",
        "Confirmed writes that removed followers from the in-sync set of a partition this "
        "server led, per hosted partition (a steady rise: a follower flapping or dying).",
        isr_changes(0),
        labels=tp,
        kind="counter",
    )
    g(
        "pidlease_server_isr_expands_total",
        "Confirmed writes that added followers back to the in-sync set of a partition this "
        "server led, per hosted partition.",
        isr_changes(1),
        labels=tp,
        kind="counter",
    )
    g(
        "pidlease_server_log_size_bytes",
        "Bytes of log segments on disk per hosted partition (what retention_bytes bounds).",
        per_partition(lambda p: p.log.size_bytes),
        labels=tp,
    )
    g(
        "pidlease_server_log_start_offset",
        "First offset still in the log per hosted partition (retention moves it up).",
        per_partition(lambda p: p.log.log_start_offset),
        labels=tp,
    )
    g(
        "pidlease_server_log_end_offset",
        "Offset the next record gets per hosted partition.",
        per_partition(lambda p: p.log.next_offset),
        labels=tp,
    )
    g(
        "pidlease_server_log_segments",
        "Segment files per hosted partition, the active one included.",
        per_partition(lambda p: len(p.log.segments)),
        labels=tp,
    )
    g(
        "pidlease_server_log_segments_deleted_total",
        "Segments retention deleted per hosted partition since this process started.",
        deleted(0),
        labels=tp,
        kind="counter",
    )
    g(
        "pidlease_server_log_bytes_deleted_total",
        "Bytes of segments retention deleted per hosted partition since this process started.",
        deleted(1),
        labels=tp,
        kind="counter",
    )


def resident_memory_bytes() -> int:
    """This process's resident set (Linux ``/proc/self/statm``); 0 where unavailable."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def parse_text(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The samples of Prometheus text as {(name, labels): value}: the inverse of
    ``render``, for tests and scripts that check what a scrape says. Raises ValueError on
    a line that is not a comment, blank, or ``name{labels} value``."""
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        if not series:
            raise ValueError(f"not a sample: {line!r}")
        name, brace, rest = series.partition("{")
        labels: list[tuple[str, str]] = []
        if brace:
            body = rest.removesuffix("}")
            i = 0
            while i < len(body):
                eq = body.index("=", i)
                key = body[i:eq]
                j = eq + 2  # past '="'
                val = []
                while body[j] != '"':
                    if body[j] == "\\":
                        j += 1
                        val.append("\n" if body[j] == "n" else body[j])
                    else:
                        val.append(body[j])
                    j += 1
                labels.append((key, "".join(val)))
                i = j + 2 if j + 1 < len(body) and body[j + 1] == "," else j + 1
        out[(name, frozenset(labels))] = float(value)
    return out


def sample(
    samples: Mapping[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    """One value out of ``parse_text``'s result; KeyError names what is missing."""
    key = (name, frozenset(labels.items()))
    if key not in samples:
        raise KeyError(f"no sample {name}{labels or ''}")
    return samples[key]
