"""bench/bench_partitions.py's pure parts (the topics of a run, the handover count read from
a server's log, the report table, the option checks) and bench/plot_partitions.py's input
handling and drawing. The benchmark itself runs a real cluster: it is run by hand
(docs/benchmarks.md, "Many partitions: leases"), not here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import bench_partitions as bp
from bench import plot_partitions as pp

# One result as bench_partitions.measure returns it (per-server dicts keyed by server id).
FULL: dict[str, Any] = {
    "partitions": 30,
    "topics": 10,
    "create_s": 0.223,
    "lease_s": 0.569,
    "first_write_all_s": 0.67,
    "first_write_errors": 0,
    "idle_cpu_pct": {1: 1.4, 2: 1.3, 3: 1.5},
    "rss_mb": {1: 54.3, 2: 54.1, 3: 54.0},
    "sockets": {1: 21, 2: 24, 3: 23},
    "zk_packets_per_s": 33.6,
    "takeover_lease_s": 0.541,
    "takeover_write_all_s": 0.592,
    "killed_led": 10,
    "failover_acked": 10,
    "failover_errors": 0,
    "failover_first_ack_s": 1.499,
    "failover_last_ack_s": 1.571,
    "restart_in_sync_s": 1.506,
    "stopped_led": 10,
    "shutdown_acked": 9,
    "shutdown_errors": 1,
    "shutdown_first_ack_s": 0.312,
    "shutdown_last_ack_s": 0.402,
    "shutdown_exit_s": 0.412,
    "handed_over": 10,
    "kept": 0,
}


# -- bench_partitions ------------------------------------------------------------------------


def test_one_topic_holds_every_partition() -> None:
    assert bp.layout(100, 1) == [("wide", 100)]


def test_partitions_spread_evenly_over_topics_with_distinct_names() -> None:
    topics = bp.layout(3000, 1000)
    assert len(topics) == 1000 and {n for _, n in topics} == {3}
    names = [t for t, _ in topics]
    assert len(set(names)) == 1000
    assert names[0] == "wide-000" and names[-1] == "wide-999"


@pytest.mark.parametrize(("partitions", "topics"), [(10, 3), (0, 1), (10, 0)])
def test_a_layout_that_does_not_split_evenly_is_refused(partitions: int, topics: int) -> None:
    with pytest.raises(ValueError, match="partitions"):
        bp.layout(partitions, topics)


def test_the_handover_count_is_the_servers_last_shutdown_line() -> None:
    log = (
        "12:00:00 INFO partition server 2 started\n"
        "12:00:05 INFO controlled shutdown: 3 partition(s) handed over, 1 kept (no live "
        "in-sync follower)\n"
        "=== start partition_server 2 at 12:00:07 ===\n"
        "12:00:09 INFO controlled shutdown: 340 partition(s) handed over, 0 kept (no live "
        "in-sync follower)\n"
    )
    assert bp.handed_over(log) == (340, 0)
    assert bp.handed_over("12:00:00 INFO partition server 2 stopped\n") is None


def test_the_table_row_shows_every_measure() -> None:
    row = bp.show(FULL)
    assert row.startswith("| 30 (10 x 3) | 0.223 s | 0.67 s (lease 0.569 s) |")
    assert "| 1.4 / 1.3 / 1.5 % |" in row and "| 21 / 24 / 23 |" in row
    assert "| 0.592 s (lease 0.541 s) |" in row
    assert "| 10 of 10: first 1.499 s, last 1.571 s |" in row
    assert row.endswith("| 9 of 10: first 0.312 s, last 0.402 s; 10 handed over, 0 kept |")
    header = bp.HEADER.splitlines()[0]
    assert row.count("|") == header.count("|")


def test_the_table_says_when_a_measure_was_skipped_or_not_logged() -> None:
    r = {k: v for k, v in FULL.items() if not k.startswith(("takeover", "failover"))}
    r.pop("handed_over")
    r.pop("kept")
    row = bp.show(r | {"topics": 1})
    assert row.startswith("| 30 | ")
    assert "| - | - | 9 of 10:" in row and row.endswith("handed over: not logged |")
    note = "restarted server: every replica back in sync: 3 topic(s) not there within 300s"
    row = bp.show(FULL | {"shutdown_note": note})
    assert row.endswith(f"10 handed over, 0 kept ({note}) |")


def test_a_run_that_stopped_early_shows_its_error() -> None:
    r = {"partitions": 1000, "topics": 1, "create_s": 4.2, "error": "producer did not start: X"}
    assert bp.show(r) == "| 1000 | 4.2 | producer did not start: X |"
    later = FULL | {"error": "TimeoutError: every ack not reached within 300s"}
    assert bp.show(later).endswith("| error: TimeoutError: every ack not reached within 300s")
    table = bp.table([FULL, r]).splitlines()
    assert table[:2] == bp.HEADER.splitlines() and len(table) == 4


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--partitions", "10,100", "--topics", "3"], "not a multiple of --topics 3"),
        (["--partitions", "10", "--topics", "0"], "at least 1"),
        (["--partitions", "ten"], "not a list of integers"),
        (["--partitions", "0"], "must be >= 1"),
    ],
)
def test_bad_options_are_refused_before_any_cluster_starts(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        bp.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


# -- plot_partitions ---------------------------------------------------------------------------


def write(path: Path, rows: Any) -> Path:
    path.write_text(json.dumps(rows))
    return path


def test_a_result_file_reads_back_into_points_by_partitions(tmp_path: Path) -> None:
    small = FULL | {"partitions": 10, "topics": 1, "first_write_all_s": 0.3}
    failed = {"partitions": 100, "topics": 1, "error": "producer did not start: X"}
    half = FULL | {"partitions": 1000, "topics": 1, "error": "TimeoutError"}
    del half["shutdown_last_ack_s"]
    # written as bench_partitions writes it: json turns the server ids into strings
    path = write(tmp_path / "after.json", [half, failed, small])
    [s] = pp.series([path])
    assert s.label == "after"
    assert [(p.partitions, p.value) for p in s.points("first_write_all_s")] == [
        (10, 0.3),
        (1000, 0.67),
    ]
    assert [p.partitions for p in s.points("shutdown_last_ack_s")] == [10]
    [cpu, _] = s.points("idle_cpu_pct")
    assert (cpu.low, cpu.high) == (1.3, 1.5) and cpu.value == pytest.approx(1.4)


def test_each_topic_count_of_a_file_is_its_own_series(tmp_path: Path) -> None:
    one = write(tmp_path / "one.json", [FULL | {"topics": 1}])
    mixed = write(tmp_path / "mixed.json", [FULL | {"topics": 1}, FULL])
    many = write(tmp_path / "many.json", [FULL])
    labels = [s.label for s in pp.series([one, mixed, many])]
    assert labels == ["one", "mixed, 1 topic", "mixed, 10 topics", "many, 10 topics"]
    assert [s.label for s in pp.series([one, many], ["before", "after"])] == ["before", "after"]
    with pytest.raises(pp.InputError, match="1 labels for 2 files"):
        pp.series([one, many], ["before"])


def test_a_figure_that_is_not_a_number_is_no_point() -> None:
    assert pp.figure({"x": float("nan")}, "x") is None
    assert pp.figure({"x": True}, "x") is None
    assert pp.figure({"x": {"1": 1.0, "2": None}}, "x") is None
    assert pp.figure({"x": {}}, "x") is None
    assert pp.figure({}, "x") is None
    assert pp.figure({"x": 2}, "x") == (2.0, 2.0, 2.0)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not JSON"),
        ('{"partitions": 10}', "not a list of results"),
        ("[3]", "result 0 is not an object"),
        ('[{"partitions": 10}, {"create_s": 1}]', "result 1: 'partitions' must be"),
        ('[{"partitions": "10"}]', "'partitions' must be a whole number"),
        ('[{"partitions": true}]', "'partitions' must be a whole number"),
        ('[{"partitions": 10, "topics": 0}]', "'topics' must be a whole number"),
    ],
)
def test_a_file_that_is_not_bench_output_is_refused_clearly(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(pp.InputError, match=message):
        pp.load(path)


def test_the_command_reports_bad_input_as_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.json"
    with pytest.raises(SystemExit) as exc:
        pp.main(["--json", str(missing), "--out", str(tmp_path / "x.png")])
    assert exc.value.code == 2
    assert f"{missing}: cannot read" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_the_plot_is_drawn_from_result_files(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")  # the bench extra
    rows = [FULL | {"partitions": n, "topics": 1} for n in (10, 100)]
    # three equal figures whose float mean is past them (1.6000000000000003): an error bar
    # below zero made matplotlib refuse the whole plot
    rows[1]["idle_cpu_pct"] = {1: 1.6, 2: 1.6, 3: 1.6}
    rows.append({"partitions": 1000, "topics": 1, "error": "producer did not start"})
    a = write(tmp_path / "a.json", rows)
    b = write(tmp_path / "b.json", [{"partitions": 10, "error": "no cluster"}])
    out = tmp_path / "img" / "partitions.png"
    assert pp.main(["--json", str(a), str(b), "--out", str(out), "--note", "test"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
