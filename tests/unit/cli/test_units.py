"""Human durations and sizes on the command line (``pidlease topic create/alter``): what
parses to what, what is refused and with which message, and that what ``describe``
prints can be typed back."""

from __future__ import annotations

import argparse

import pytest

from pidlease.cli.commands import _settings_line, build_parser, main
from pidlease.cli.units import (
    exact_bytes,
    exact_ms,
    human_bytes,
    parse_retention_bytes,
    parse_retention_ms,
    parse_segment_bytes,
    parse_segment_ms,
)

DAY = 86_400_000


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("500ms", 500),
        ("30s", 30_000),
        ("5m", 300_000),
        ("1h", 3_600_000),
        ("7d", 7 * DAY),
        (" 2d ", 2 * DAY),
        ("forever", -1),
        ("FOREVER", -1),
        ("-1", -1),
        ("0s", 0),  # parsed; the coordinator refuses it, naming retention_ms
    ],
)
def test_retention_durations(text: str, ms: int) -> None:
    assert parse_retention_ms(text) == ms


def test_segment_age_takes_never_and_retention_does_not() -> None:
    assert parse_segment_ms("never") == -1 and parse_segment_ms("-1") == -1
    assert parse_segment_ms("1h") == 3_600_000
    # "never" for a retention could be read as "keep nothing": only "forever" is taken.
    with pytest.raises(argparse.ArgumentTypeError, match=r"'never' is not a duration"):
        parse_retention_ms("never")


@pytest.mark.parametrize("bad", ["7", "7 days", "1.5h", "-2d", "7w", "", "h", "1e3ms", "-5"])
def test_bad_durations_name_the_accepted_forms(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as info:
        parse_retention_ms(bad)
    message = str(info.value)
    assert f"{bad!r} is not a duration" in message
    assert "ms, s, m, h or d" in message and "'forever'" in message


@pytest.mark.parametrize(
    ("text", "n"),
    [
        ("4096", 4096),
        ("100B", 100),
        ("1KiB", 1024),
        ("256MiB", 256 << 20),
        ("1GiB", 1 << 30),
        ("2TiB", 2 << 40),
        ("1kib", 1024),
        ("1 GiB", 1 << 30),
        ("5KB", 5000),
        ("500MB", 500_000_000),
        ("1GB", 10**9),
        ("3TB", 3 * 10**12),
        ("unlimited", -1),
        ("-1", -1),
        ("99999999999999999999GiB", 99999999999999999999 << 30),  # the coordinator caps it
    ],
)
def test_retention_sizes(text: str, n: int) -> None:
    assert parse_retention_bytes(text) == n


@pytest.mark.parametrize("bad", ["1.5GiB", "1GiBs", "1XB", "GiB", "", "-2", "1 G", "ten"])
def test_bad_sizes_name_the_accepted_forms(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as info:
        parse_retention_bytes(bad)
    message = str(info.value)
    assert f"{bad!r} is not a size" in message
    assert "KiB, MiB, GiB" in message and "KB, MB, GB" in message and "'unlimited'" in message


def test_segment_bytes_default_word() -> None:
    assert parse_segment_bytes("default") == 0 and parse_segment_bytes("256MiB") == 256 << 20
    with pytest.raises(argparse.ArgumentTypeError, match=r"'unlimited' is not a size"):
        parse_segment_bytes("unlimited")


@pytest.mark.parametrize(
    ("ms", "text"),
    [(-1, "forever"), (7 * DAY, "7d"), (90 * 60_000, "90m"), (1500, "1500ms"), (0, "0ms")],
)
def test_exact_ms_types_back(ms: int, text: str) -> None:
    assert exact_ms(ms) == text
    assert parse_retention_ms(text) == ms


@pytest.mark.parametrize(
    ("n", "text"),
    [(-1, "unlimited"), (1 << 30, "1GiB"), (3 << 19, "1536KiB"), (1000, "1000B"), (0, "0B")],
)
def test_exact_bytes_types_back(n: int, text: str) -> None:
    assert exact_bytes(n) == text
    assert parse_retention_bytes(text) == n


def test_human_bytes() -> None:
    assert [human_bytes(n) for n in (-1, 0, 1536, 5 << 30)] == ["-", "0B", "1.5KiB", "5.0GiB"]


def test_create_and_alter_flags_parse_to_api_fields() -> None:
    args = build_parser().parse_args(
        [
            "topic",
            "create",
            "t",
            "--retention",
            "7d",
            "--retention-bytes",
            "1GiB",
            "--segment-bytes",
            "256MiB",
            "--segment-ms",
            "1h",
            "--min-insync-replicas",
            "2",
        ]
    )
    assert (
        args.retention_ms,
        args.retention_bytes,
        args.segment_bytes,
        args.segment_ms,
        args.min_insync_replicas,
    ) == (7 * DAY, 1 << 30, 256 << 20, 3_600_000, 2)
    alter = build_parser().parse_args(["topic", "alter", "t", "--retention", "forever"])
    assert (alter.retention_ms, alter.retention_bytes) == (-1, None)


def test_alter_needs_a_flag_and_a_bad_unit_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["topic", "alter", "t", "--coordinator", "http://127.0.0.1:9"]) == 2
    assert "nothing to change; give at least one of --retention" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["topic", "alter", "t", "--retention-bytes", "1GB5"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--retention-bytes" in err and "'1GB5' is not a size" in err and "KiB" in err


def test_settings_line() -> None:
    body = {
        "retention_ms": 7 * DAY,
        "retention_bytes": -1,
        "segment_bytes": 0,
        "segment_ms": -1,
        "min_insync_replicas": 0,
        "min_insync_replicas_effective": 2,
    }
    assert _settings_line(body) == (
        "retention 7d, retention bytes unlimited per partition, segment bytes server default, "
        "segment age never, min in-sync replicas default (2)"
    )
    body.update(retention_bytes=1 << 30, segment_bytes=4 << 20, min_insync_replicas=3)
    assert "retention bytes 1GiB" in _settings_line(body)
    assert "segment bytes 4MiB" in _settings_line(body)
    assert _settings_line(body).endswith("min in-sync replicas 3")
    assert "not reported" in _settings_line({"name": "t"})
