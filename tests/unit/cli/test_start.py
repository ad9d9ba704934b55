"""``pidlease consume``'s start options: ``--from OFFSET|earliest|latest`` and
``--from-time`` (ms since the epoch or ISO 8601, UTC without an offset), exclusive."""

from __future__ import annotations

import argparse
import time

import pytest

from pidlease.cli.commands import build_parser
from pidlease.cli.units import parse_start, parse_time_ms


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("0", 0),
        ("1732441200000", 1_732_441_200_000),
        ("2024-11-24T09:40:00Z", 1_732_441_200_000),
        ("2024-11-24T09:40:00", 1_732_441_200_000),  # no offset: UTC
        ("2024-11-24T10:40:00+01:00", 1_732_441_200_000),
        ("2024-11-24T09:40:00.250z", 1_732_441_200_250),
        ("1970-01-01", 0),
    ],
)
def test_times(text: str, ms: int) -> None:
    assert parse_time_ms(text) == ms


def test_a_time_without_an_offset_is_utc_whatever_the_local_zone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TZ", "Asia/Kolkata")  # +05:30: a local reading would be off by it
    time.tzset()
    try:
        assert parse_time_ms("2024-11-24T09:40:00") == 1_732_441_200_000
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize("bad", ["", "yesterday", "-5", "1h", "2024-13-01", "1969-12-31T00:00Z"])
def test_bad_times_name_the_accepted_forms(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="ISO 8601"):
        parse_time_ms(bad)


def test_starts() -> None:
    assert [parse_start(t) for t in ("0", "17", "earliest", "LATEST")] == [
        0,
        17,
        "earliest",
        "latest",
    ]
    for bad in ("-1", "first", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError, match="earliest"):
            parse_start(bad)


def test_consume_takes_one_start() -> None:
    p = build_parser()
    a = p.parse_args(["consume", "t"])
    assert (a.from_offset, a.from_time) == (0, None)
    a = p.parse_args(["consume", "t", "--from", "earliest"])
    assert (a.from_offset, a.from_time) == ("earliest", None)
    a = p.parse_args(["consume", "t", "--from-time", "2024-11-24T09:40:00Z"])
    assert a.from_time == 1_732_441_200_000
    with pytest.raises(SystemExit):
        p.parse_args(["consume", "t", "--from", "3", "--from-time", "5"])
