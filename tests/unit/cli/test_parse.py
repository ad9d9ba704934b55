"""The command line's parsing and error reporting, without a cluster."""

from __future__ import annotations

import argparse
import socket

import pytest

from pidlease.cli.commands import _human_ms, _table, build_parser, main, parse_duration_ms
from pidlease.cli.demo import schedule


def test_durations() -> None:
    assert [parse_duration_ms(x) for x in ("500ms", "30s", "5m", "1h", "2d")] == [
        500,
        30_000,
        300_000,
        3_600_000,
        172_800_000,
    ]
    for bad in ("5", "5x", "-1s", "1.5h", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_duration_ms(bad)
    assert _human_ms(90_000) == "1.5m" and _human_ms(-2000) == "-2.0s" and _human_ms(5) == "5ms"


def test_table_aligns_columns() -> None:
    out = _table([[1, "a"], [100, "bbb"]], ["ID", "NAME"]).splitlines()
    assert out == ["ID   NAME", "1    a", "100  bbb"]


def test_parser_defaults_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIDLEASE_COORDINATOR", "http://127.0.0.1:9999")
    args = build_parser().parse_args(["consume", "t", "--partition", "2", "--from", "7"])
    assert (args.coordinator, args.partition, args.from_offset, args.max) == (
        "http://127.0.0.1:9999",
        2,
        7,
        None,
    )
    up = build_parser().parse_args(["dev", "up"])
    assert (up.servers, up.port, up.data_dir, up.detach, up.zk_nodes) == (
        1,
        8470,
        "pidlease-data",
        False,
        1,
    )
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["dev", "up", "--zk-nodes", "2"])
    assert e.value.code == 2


def test_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "examples:" in out and "pidlease dev up" in out and "pidlease verify" in out


def test_unreachable_coordinator_is_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        rc = main(["topic", "list", "--coordinator", f"http://127.0.0.1:{port}"])
    err = capsys.readouterr().err
    assert rc == 1
    assert err.startswith("error: COORDINATOR_UNAVAILABLE") and "hint:" in err


def test_dev_up_rejects_bad_sizes(capsys: pytest.CaptureFixture[str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert (
        main(
            [
                "dev",
                "up",
                "--servers",
                "1",
                "--replication-factor",
                "3",
                "--data-dir",
                str(tmp_path),
            ]
        )
        == 1
    )
    assert "raise --servers" in capsys.readouterr().err


def test_dev_down_without_state(capsys: pytest.CaptureFixture[str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert main(["dev", "down", "--data-dir", str(tmp_path)]) == 1
    assert "is one running" in capsys.readouterr().err


def test_demo_schedule_is_seeded_and_in_range() -> None:
    a = schedule(5, 200_000)
    assert a == schedule(5, 200_000) and a != schedule(6, 200_000)
    assert [f.kind for f in a].count("kill") == 2 and [f.kind for f in a].count("drop") == 4
    assert all(0 < f.at_record < 200_000 for f in a)
    kills = [f for f in a if f.kind == "kill"]
    assert kills[0].at_record < kills[1].at_record
    assert all(300 <= f.downtime_ms <= 1500 for f in kills)


def test_demo_refuses_a_used_data_dir(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "something").write_text("x")
    assert main(["demo", "--data-dir", str(tmp_path), "--records", "1000"]) == 2
    assert "not empty" in capsys.readouterr().err


def test_topic_help_says_min_insync_is_enforced() -> None:
    """Issue 23 item 7: the help still said the minimum was "not enforced yet" long after
    produces and fences were refused below it (NOT_ENOUGH_REPLICAS)."""
    topic = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices["topic"]
    create = next(a for a in topic._actions if isinstance(a, argparse._SubParsersAction)).choices[
        "create"
    ]
    text = " ".join(create.format_help().split())
    assert "--min-insync-replicas" in text
    assert "not enforced" not in text and "NOT_ENOUGH_REPLICAS" in text
