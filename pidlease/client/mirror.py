"""Copying topics from one cluster to another (``pidlease mirror``), effectively once.

A mirror is one ``AsyncProcessor`` per topic with the identity function and
``fanout_max=1``: source partition ``p`` goes to target partition ``p`` through the named
producer ``<name>/<topic>/<p>``, whose sequence id of each record is its source offset, and
each record keeps its key, value and timestamp. So the target's ``last_sequence_id`` of
that name is the last source offset copied, and a restart resumes right after it
(``docs/processing.md``). ``prepare_topics`` creates missing target topics with the
source's partition count (``dedup=monotonic``: source offsets have holes where control
records sit) and refuses a target whose partitions or mode do not fit. ``lag_metrics``
renders the lag as Prometheus text.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pidlease import errors
from pidlease.client.lease_client import LeaseClient
from pidlease.client.processor import AsyncProcessor, Output, ProcessorStats
from pidlease.wire.protocol import Record


@dataclass(frozen=True)
class Endpoint:
    """One side of a mirror: a coordinator URL and how to reach it."""

    url: str
    api_token: str | None = None
    tls_ca_file: str | None = None

    def client(self) -> LeaseClient:
        return LeaseClient(self.url, api_token=self.api_token, tls_ca_file=self.tls_ca_file)


def same_record(rec: Record) -> tuple[Output]:
    """The mirror's function: the record itself (its timestamp is kept by the processor)."""
    return ((rec.key, rec.value),)


def prepare_topics(
    source: Endpoint,
    target: Endpoint,
    topics: Iterable[str],
    *,
    replication_factor: int | None = None,
) -> dict[str, tuple[int, bool]]:
    """Each topic's partition count, and whether the target topic was created now. A
    missing target topic is created with the source's partitions (and its replication
    factor unless ``replication_factor``), ``dedup=monotonic``; an existing one must have
    the same partitions and be monotonic (``ConfigError`` otherwise)."""
    out: dict[str, tuple[int, bool]] = {}
    with source.client() as src, target.client() as dst:
        for topic in topics:
            info = src.topic(topic, offsets=False)
            created = False
            try:
                have = dst.topic(topic, offsets=False)
            except errors.UnknownTopicOrPartition:
                try:
                    dst.create_topic(
                        topic,
                        partitions=info.partitions,
                        replication_factor=replication_factor or info.replication_factor,
                        dedup="monotonic",
                    )
                    created = True
                except errors.TopicExists:
                    pass  # another mirror instance made it first
                have = dst.topic(topic, offsets=False)
            if have.partitions != info.partitions:
                raise errors.ConfigError(
                    f"target topic {topic!r} has {have.partitions} partitions, the source "
                    f"{info.partitions}: a mirror copies partition p to partition p"
                )
            if have.dedup != "monotonic":
                raise errors.ConfigError(
                    f"target topic {topic!r} is dedup={have.dedup}; a mirror needs a "
                    "monotonic target (its sequence ids are source offsets)"
                )
            out[topic] = (info.partitions, created)
    return out


class Mirror:
    """Mirrors ``topics`` from ``source`` to ``target`` under ``name``: ``await run()``.
    Instances with the same ``name`` share the source partitions through the consumer
    group of ``name`` (``processor_group``; ``group=None`` decides as ``uses_group``:
    static with ``partitions``, ``instances`` or ``until_caught_up``)."""

    def __init__(
        self,
        source: Endpoint,
        target: Endpoint,
        topics: list[str],
        *,
        name: str = "mirror",
        until_caught_up: bool = False,
        partitions: list[int] | None = None,
        instance: int = 0,
        instances: int = 1,
        group: bool | None = None,
        producer_options: dict[str, object] | None = None,
    ) -> None:
        if not topics:
            raise errors.ConfigError("give at least one topic to mirror")
        self.source, self.target, self.topics, self.name = source, target, topics, name
        self.processors = {
            t: AsyncProcessor(
                source.url,
                t,
                t,
                name,
                same_record,
                output_url=target.url,
                fanout_max=1,
                partitions=partitions,
                instance=instance,
                instances=instances,
                group=group,
                until_caught_up=until_caught_up,
                api_token=source.api_token,
                tls_ca_file=source.tls_ca_file,
                output_api_token=target.api_token,
                output_tls_ca_file=target.tls_ca_file,
                producer_options=dict(producer_options or {}),
            )
            for t in topics
        }

    def stop(self) -> None:
        for p in self.processors.values():
            p.stop()

    @property
    def stats(self) -> dict[str, ProcessorStats]:
        return {t: p.stats for t, p in self.processors.items()}

    async def run(
        self,
        *,
        on_progress: Callable[[dict[str, ProcessorStats]], None] | None = None,
        progress_interval_s: float = 5.0,
    ) -> dict[str, ProcessorStats]:
        """Run every topic's processor; the first failure stops the others and is raised."""
        tasks = [asyncio.create_task(p.run()) for p in self.processors.values()]
        ticker = None
        if on_progress is not None:

            async def tick() -> None:
                while True:
                    await asyncio.sleep(progress_interval_s)
                    on_progress(self.stats)

            ticker = asyncio.create_task(tick())
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in done:
                exc = t.exception()
                if exc is not None:
                    raise exc
        finally:
            if ticker is not None:
                ticker.cancel()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return self.stats


def lag_metrics(name: str, stats: dict[str, ProcessorStats]) -> str:
    """The mirror's figures as Prometheus text: lag, position and records copied per
    source topic and partition."""

    def label(topic: str, p: int) -> str:
        return f'{{mirror="{name}",topic="{topic}",partition="{p}"}}'

    lines = [
        "# HELP pidlease_mirror_lag_records source records not copied yet, as of the last fetch",
        "# TYPE pidlease_mirror_lag_records gauge",
    ]
    rows = [(t, pp) for t, s in stats.items() for pp in s.partitions.values()]
    lines += [f"pidlease_mirror_lag_records{label(t, pp.partition)} {pp.lag}" for t, pp in rows]
    lines += [
        "# HELP pidlease_mirror_position next source offset to copy",
        "# TYPE pidlease_mirror_position gauge",
    ]
    lines += [f"pidlease_mirror_position{label(t, pp.partition)} {pp.position}" for t, pp in rows]
    lines += [
        "# HELP pidlease_mirror_records_total source records handed to the target by this run",
        "# TYPE pidlease_mirror_records_total counter",
    ]
    lines += [
        f"pidlease_mirror_records_total{label(t, pp.partition)} {pp.processed}" for t, pp in rows
    ]
    return "\n".join(lines) + "\n"


def progress_line(stats: dict[str, ProcessorStats]) -> str:
    """One line for a terminal: total lag, per topic, and records copied."""
    parts = []
    total_lag = 0
    copied = 0
    for t, s in stats.items():
        lag = s.lag
        total_lag = -1 if lag < 0 or total_lag < 0 else total_lag + lag
        copied += sum(pp.processed for pp in s.partitions.values())
        parts.append(f"{t} {'?' if lag < 0 else lag}")
    lag_s = "?" if total_lag < 0 else str(total_lag)
    return f"mirror: copied {copied}, lag {lag_s} records ({', '.join(parts)})"
