"""Durations and sizes as people type them on the command line (``7d``, ``512MiB``,
``forever``) and as the CLI prints them back; the API itself speaks only ms and bytes.

Parsers raise ``argparse.ArgumentTypeError`` naming the accepted forms, so argparse turns
a bad value into a usage error (exit 2) that says what to type instead.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from datetime import UTC, datetime

_DURATION = re.compile(r"^(\d+)(ms|s|m|h|d)$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
DURATION_FORMS = "a whole number with ms, s, m, h or d (500ms, 30s, 5m, 1h, 7d)"

_SIZE = re.compile(r"^(\d+)\s*([a-z]*)$")
_UNIT_BYTES = {
    "": 1,
    "b": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
SIZE_FORMS = (
    "a whole number of bytes, or with B, KiB, MiB, GiB, TiB (x1024) or KB, MB, GB, TB (x1000)"
)


def parse_duration_ms(text: str) -> int:
    m = _DURATION.match(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration; use {DURATION_FORMS}")
    return int(m.group(1)) * _UNIT_MS[m.group(2)]


def duration_or(**words: int) -> Callable[[str], int]:
    """A duration parser that also takes the given words (``forever=-1``) and "-1" when -1
    is one of them."""
    accepted = dict(words)
    if -1 in accepted.values():
        accepted["-1"] = -1

    def parse(text: str) -> int:
        word = text.strip().lower()
        if word in accepted:
            return accepted[word]
        try:
            return parse_duration_ms(text)
        except argparse.ArgumentTypeError:
            alts = " or ".join(repr(w) for w in accepted)
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a duration; use {DURATION_FORMS}, or {alts}"
            ) from None

    return parse


def size_or(**words: int) -> Callable[[str], int]:
    """A size parser (units case-insensitive) that also takes the given words
    (``unlimited=-1``) and "-1" when -1 is one of them."""
    accepted = dict(words)
    if -1 in accepted.values():
        accepted["-1"] = -1

    def parse(text: str) -> int:
        word = text.strip().lower()
        if word in accepted:
            return accepted[word]
        m = _SIZE.match(word)
        if not m or m.group(2) not in _UNIT_BYTES:
            alts = "".join(f", or {w!r}" for w in accepted)
            raise argparse.ArgumentTypeError(f"{text!r} is not a size; use {SIZE_FORMS}{alts}")
        return int(m.group(1)) * _UNIT_BYTES[m.group(2)]

    return parse


TIME_FORMS = (
    "ms since the epoch (1732441200000) or an ISO 8601 time "
    "(2026-11-24T10:00:00Z, 2026-11-24T11:00+01:00; without an offset: UTC)"
)


def parse_time_ms(text: str) -> int:
    """A point in time as ms since the epoch: digits are ms already, anything else is
    ISO 8601 (a trailing ``Z`` is UTC, as is a time without an offset: a server's logs and
    batch timestamps are in UTC, so a local default would surprise more)."""
    t = text.strip()
    if t.isdigit():
        return int(t)
    try:
        when = datetime.fromisoformat(t[:-1] + "+00:00" if t.endswith(("Z", "z")) else t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a time; use {TIME_FORMS}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    ms = int(when.timestamp() * 1000)
    if ms < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is before 1970; use {TIME_FORMS}")
    return ms


def parse_start(text: str) -> int | str:
    """Where a reader starts: an offset (a whole number), ``earliest`` or ``latest``."""
    word = text.strip().lower()
    if word in ("earliest", "latest"):
        return word
    if word.isdigit():
        return int(word)
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a start; use an offset (0, 1200), 'earliest' or 'latest'"
    )


parse_retention_ms = duration_or(forever=-1)
parse_segment_ms = duration_or(never=-1)
parse_retention_bytes = size_or(unlimited=-1)
parse_segment_bytes = size_or(default=0)


def human_ms(ms: int) -> str:
    """About how long ``ms`` is, one decimal (for times that pass: expiries, ages)."""
    sign = "-" if ms < 0 else ""
    ms = abs(ms)
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size:
            return f"{sign}{ms / size:.1f}{unit}"
    return f"{sign}{ms}ms"


def exact_ms(ms: int, *, minus_one: str = "forever") -> str:
    """A setting in the largest unit that states it exactly (``7d``, ``90m``), so what is
    printed can be typed back."""
    if ms == -1:
        return minus_one
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def exact_bytes(n: int, *, minus_one: str = "unlimited") -> str:
    """A size in the largest binary unit that states it exactly (``256MiB``, ``1000B``)."""
    if n == -1:
        return minus_one
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        size = _UNIT_BYTES[unit.lower()]
        if n and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n}B"


def human_bytes(n: int) -> str:
    """About how big ``n`` bytes are, one decimal; ``-`` when unknown (negative)."""
    if n < 0:
        return "-"
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        size = _UNIT_BYTES[unit.lower()]
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n}B"
