"""The coordinator's counters and the lease-latency histogram, rendered as Prometheus text.

Written by hand (a few counters do not justify a dependency); thread-safe because request
handlers run on many threads. ZooKeeper request counts are read from the store at render
time so there is one source of truth for them. Labelled gauges (PIDs per lease state) are
callbacks too; one that has nothing to say yet (None) or fails is left out of the scrape
rather than failing it, so ``/metrics`` answers even while ZooKeeper is down.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Callable

log = logging.getLogger("coordinator.metrics")

# Seconds; a lease is one or two ZooKeeper round trips plus maybe a leader call.
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.leases: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.takeovers = 0
        self.fences_sent = 0
        self._bucket_counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self._latency_sum_s = 0.0
        self._latency_count = 0
        self.gauges: dict[str, Callable[[], float]] = {}
        # name -> (help, label name, callback returning {label value: number} or None)
        self.labelled: dict[str, tuple[str, str, Callable[[], dict[str, float] | None]]] = {}
        # name -> (help, callback returning [({label: value}, number)] or None): gauges
        # with several labels (consumer group lag by group, topic and partition).
        self.multi_labelled: dict[
            str, tuple[str, Callable[[], list[tuple[dict[str, str], float]] | None]]
        ] = {}

    def lease_done(self, kind: str, latency_s: float) -> None:
        with self._lock:
            self.leases[kind] = self.leases.get(kind, 0) + 1
            if kind == "takeover":
                self.takeovers += 1
            self._observe(latency_s)

    def lease_failed(self, latency_s: float) -> None:
        with self._lock:
            self._observe(latency_s)

    def _observe(self, latency_s: float) -> None:
        self._bucket_counts[bisect.bisect_left(LATENCY_BUCKETS_S, latency_s)] += 1
        self._latency_sum_s += latency_s
        self._latency_count += 1

    def error(self, code: str) -> None:
        with self._lock:
            self.errors[code] = self.errors.get(code, 0) + 1

    def fences(self, n: int) -> None:
        with self._lock:
            self.fences_sent += n

    def render(self) -> str:
        with self._lock:
            leases = dict(self.leases)
            errors = dict(self.errors)
            buckets = list(self._bucket_counts)
            total_s, count = self._latency_sum_s, self._latency_count
            takeovers, fences = self.takeovers, self.fences_sent
        lines = [
            "# HELP pidlease_leases_total Successful lease_pid requests by kind.",
            "# TYPE pidlease_leases_total counter",
        ]
        for kind in ("new", "renew", "takeover"):
            lines.append(f'pidlease_leases_total{{kind="{kind}"}} {leases.get(kind, 0)}')
        lines += [
            "# HELP pidlease_takeovers_total Takeovers (generation raised).",
            "# TYPE pidlease_takeovers_total counter",
            f"pidlease_takeovers_total {takeovers}",
            "# HELP pidlease_fences_sent_total FENCE requests sent to partition leaders.",
            "# TYPE pidlease_fences_sent_total counter",
            f"pidlease_fences_sent_total {fences}",
            "# HELP pidlease_errors_total Error responses by code.",
            "# TYPE pidlease_errors_total counter",
        ]
        for code in sorted(errors):
            lines.append(f'pidlease_errors_total{{code="{code}"}} {errors[code]}')
        lines += [
            "# HELP pidlease_lease_latency_seconds Time to answer one lease_pid request.",
            "# TYPE pidlease_lease_latency_seconds histogram",
        ]
        running = 0
        for le, n in zip(LATENCY_BUCKETS_S, buckets, strict=False):
            running += n
            lines.append(f'pidlease_lease_latency_seconds_bucket{{le="{le}"}} {running}')
        lines.append(f'pidlease_lease_latency_seconds_bucket{{le="+Inf"}} {count}')
        lines.append(f"pidlease_lease_latency_seconds_sum {total_s:.6f}")
        lines.append(f"pidlease_lease_latency_seconds_count {count}")
        for name, fn in sorted(self.gauges.items()):
            kind = "counter" if name.endswith("_total") else "gauge"
            lines += [f"# TYPE {name} {kind}", f"{name} {fn()}"]
        for name, (help_text, label, values_fn) in sorted(self.labelled.items()):
            try:
                values = values_fn()
            except Exception:
                log.exception("gauge %s failed", name)
                continue
            if values is None:
                continue
            kind = "counter" if name.endswith("_total") else "gauge"
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            lines += [f'{name}{{{label}="{key}"}} {v}' for key, v in sorted(values.items())]
        for name, (help_text, samples_fn) in sorted(self.multi_labelled.items()):
            try:
                samples = samples_fn()
            except Exception:
                log.exception("gauge %s failed", name)
                continue
            if samples is None:
                continue
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
            for labels, v in samples:
                text = ",".join(f'{k}="{label_value(x)}"' for k, x in labels.items())
                lines.append(f"{name}{{{text}}} {v}")
        return "\n".join(lines) + "\n"


def label_value(text: str) -> str:
    """A Prometheus label value: backslash, double quote and newline escaped (a group id
    may hold any of them)."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
