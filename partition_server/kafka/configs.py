"""Kafka topic configs and the topic settings they stand for: the same fields as
``PATCH /v1/topics`` (``TopicSpec``'s log settings, checked by the same
``cluster.log_setting_problem``), plus ``pidlease.dedup`` (fixed at creation) and
``cleanup.policy`` (only ``delete``, what every pidlease log does). Any other name is
INVALID_CONFIG naming it: a setting we would ignore is never taken silently.

Used by CreateTopics (configs of a new topic), DescribeConfigs, AlterConfigs and
IncrementalAlterConfigs (``admin.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pidlease.wire.cluster import DEDUP_MODES, TopicSpec, log_setting_problem
from pidlease.wire.kafka_errors import (
    INVALID_CONFIG,
)

# Kafka name -> TopicSpec field (a log setting: may change after creation)
SETTINGS = {
    "retention.ms": "retention_ms",
    "retention.bytes": "retention_bytes",
    "segment.bytes": "segment_bytes",
    "segment.ms": "segment_ms",
    "min.insync.replicas": "min_insync_replicas",
}
DEDUP = "pidlease.dedup"  # strict|monotonic|off, fixed for the topic's life
CLEANUP = "cleanup.policy"  # delete only: no compaction here
KNOWN = (*SETTINGS, CLEANUP, DEDUP)

# DescribeConfigs' config_source and config_type (Kafka's numbering)
SOURCE_DYNAMIC_TOPIC = 1
SOURCE_DEFAULT = 5
TYPE_STRING = 2
TYPE_INT = 3
TYPE_LONG = 5
TYPE_LIST = 7
_TYPES = {
    "retention.ms": TYPE_LONG,
    "retention.bytes": TYPE_LONG,
    "segment.bytes": TYPE_INT,
    "segment.ms": TYPE_LONG,
    "min.insync.replicas": TYPE_INT,
    CLEANUP: TYPE_LIST,
    DEDUP: TYPE_STRING,
}
_DOCS = {
    "retention.ms": "records older than this are deleted a segment at a time (-1: kept)",
    "retention.bytes": "a partition's log is cut to this size a segment at a time (-1: no limit)",
    "segment.bytes": "segment file size (0 in PATCH /v1/topics: the server's segment_bytes_max)",
    "segment.ms": "an active segment older than this rolls (-1: never by time)",
    "min.insync.replicas": "in-sync replicas an acks=all produce needs",
    CLEANUP: "delete only: pidlease does not compact",
    DEDUP: "pidlease's duplicate rule for this topic (strict|monotonic|off), fixed at creation",
}
_DEFAULTS = TopicSpec(name="-", partitions=1)


class ConfigError(Exception):
    def __init__(self, message: str, code: int = INVALID_CONFIG) -> None:
        super().__init__(message)
        self.code = code


def unknown_problem(names: list[str]) -> str | None:
    bad = sorted({n for n in names if n not in KNOWN})
    if not bad:
        return None
    return (
        f"unsupported topic config(s): {', '.join(bad)}; supported: {', '.join(KNOWN)} "
        "(the settings of PATCH /v1/topics)"
    )


def _int(name: str, value: str | None) -> int:
    if value is None:
        raise ConfigError(f"{name} needs a value")
    try:
        n = int(value.strip())
    except ValueError:
        raise ConfigError(f"{name} must be an integer, not {value!r}") from None
    field = SETTINGS[name]
    problem = log_setting_problem(field, n)
    if problem:
        raise ConfigError(f"{name}: {problem}")
    return n


def for_create(
    configs: dict[str, str | None], replication_factor: int
) -> tuple[str, dict[str, int]]:
    """(dedup, log settings) of a new topic's configs; ConfigError naming what is wrong."""
    problem = unknown_problem(list(configs))
    if problem:
        raise ConfigError(problem)
    dedup = configs.get(DEDUP) or "strict"
    if dedup not in DEDUP_MODES:
        raise ConfigError(f"{DEDUP} must be one of {', '.join(DEDUP_MODES)}, not {dedup!r}")
    _check_cleanup(configs)
    settings = {SETTINGS[k]: _int(k, v) for k, v in configs.items() if k in SETTINGS}
    _check_min_insync(settings, replication_factor)
    return dedup, settings


def _check_cleanup(configs: dict[str, str | None]) -> None:
    if CLEANUP in configs and (configs[CLEANUP] or "").strip() != "delete":
        raise ConfigError(
            f"{CLEANUP} must be delete (no compaction here), not {configs[CLEANUP]!r}"
        )


def _check_min_insync(settings: dict[str, int], replication_factor: int) -> None:
    want = settings.get("min_insync_replicas", 0)
    if want > replication_factor:
        raise ConfigError(
            f"min.insync.replicas {want} is more than the topic's replication factor "
            f"{replication_factor}"
        )


def altered(
    spec: TopicSpec, sets: dict[str, str | None], deletes: list[str], *, replace: bool
) -> TopicSpec:
    """``spec`` with ``sets`` applied and ``deletes`` back at their defaults (``replace``:
    AlterConfigs, where every setting not named goes back to its default). The dedup mode
    and cleanup policy cannot change: naming them with another value is INVALID_CONFIG."""
    problem = unknown_problem([*sets, *deletes])
    if problem:
        raise ConfigError(problem)
    if DEDUP in deletes or (DEDUP in sets and sets[DEDUP] != spec.dedup):
        raise ConfigError(f"{DEDUP} is fixed when the topic is created ({spec.dedup})")
    if CLEANUP in deletes:
        deletes = [d for d in deletes if d != CLEANUP]
    _check_cleanup(sets)
    new = dataclasses.replace(spec)
    reset = set(SETTINGS) - set(sets) if replace else set(deletes)
    for name in reset & set(SETTINGS):
        setattr(new, SETTINGS[name], getattr(_DEFAULTS, SETTINGS[name]))
    changes = {SETTINGS[k]: _int(k, v) for k, v in sets.items() if k in SETTINGS}
    for field, value in changes.items():
        setattr(new, field, value)
    _check_min_insync({"min_insync_replicas": new.min_insync_replicas}, spec.replication_factor)
    return new


def describe(
    spec: TopicSpec, segment_bytes_max: int, keys: list[str] | None
) -> list[dict[str, Any]]:
    """DescribeConfigs' entries for ``spec`` (all when ``keys`` is None; unknown keys are
    left out, as Kafka does). Values are what the partitions apply: a stored 0 for
    segment.bytes or min.insync.replicas shows the default it stands for."""
    out = []
    for name in KNOWN:
        if keys is not None and name not in keys:
            continue
        if name == DEDUP:
            value, default, read_only = spec.dedup, spec.dedup == _DEFAULTS.dedup, True
        elif name == CLEANUP:
            value, default, read_only = "delete", True, True
        else:
            field = SETTINGS[name]
            stored = getattr(spec, field)
            default = stored == getattr(_DEFAULTS, field)
            read_only = False
            if field == "segment_bytes" and stored == 0:
                stored = segment_bytes_max
            elif field == "min_insync_replicas" and stored == 0:
                stored = spec.min_insync
            value = str(stored)
        out.append(
            {
                "name": name,
                "value": value,
                "read_only": read_only,
                "is_default": default,
                "config_source": SOURCE_DEFAULT if default else SOURCE_DYNAMIC_TOPIC,
                "is_sensitive": False,
                "synonyms": [],
                "config_type": _TYPES[name],
                "documentation": _DOCS[name],
            }
        )
    return out
