"""``pidlease mirror``'s command line and figures (the behaviour is tested on real clusters in
tests/integration/test_processor_mirror.py)."""

from __future__ import annotations

import pytest

from pidlease import errors
from pidlease.cli.commands import build_parser, main
from pidlease.cli.mirror import group_choice
from pidlease.client.mirror import Endpoint, Mirror, lag_metrics, progress_line
from pidlease.client.processor import PartitionProgress, ProcessorStats


def test_mirror_flags_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIDLEASE_TARGET_API_TOKEN", "t-token")
    args = build_parser().parse_args(
        ["mirror", "--source", "http://a:1", "--target", "http://b:2", "--topics", "x,y"]
    )
    assert (args.source, args.target, args.topics, args.name) == (
        "http://a:1",
        "http://b:2",
        "x,y",
        "mirror",
    )
    assert args.target_api_token == "t-token" and args.source_api_token is None
    assert not args.until_caught_up


def _mirror(*flags: str) -> Mirror:
    argv = ["mirror", "--source", "http://a:1", "--target", "http://b:2", "--topics", "x,y"]
    args = build_parser().parse_args([*argv, *flags])
    return Mirror(
        Endpoint(args.source),
        Endpoint(args.target),
        args.topics.split(","),
        name=args.name,
        until_caught_up=args.until_caught_up,
        instance=args.instance,
        instances=args.instances,
        group=group_choice(args),
    )


def test_mirrors_of_a_name_share_partitions_through_the_group_by_default() -> None:
    assert all(p.group for p in _mirror().processors.values())
    assert all(p.group for p in _mirror("--group").processors.values())
    for static in (["--no-group"], ["--until-caught-up"], ["--instance", "1", "--instances", "2"]):
        assert not any(p.group for p in _mirror(*static).processors.values()), static
    with pytest.raises(errors.ConfigError, match="group=True"):
        _mirror("--group", "--until-caught-up")
    with pytest.raises(SystemExit):
        _mirror("--group", "--no-group")


def test_mirror_unreachable_source_is_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    nowhere = "http://127.0.0.1:9"
    code = main(["mirror", "--source", nowhere, "--target", nowhere, "--topics", "orders"])
    err = capsys.readouterr().err
    assert code == 1
    assert "COORDINATOR_UNAVAILABLE" in err and "http://127.0.0.1:9" in err
    assert "8470" not in err  # the hint does not name a coordinator the user never gave


def test_lag_metrics_and_progress() -> None:
    s = ProcessorStats(
        {
            0: PartitionProgress(0, position=10, high_watermark=15, processed=10),
            1: PartitionProgress(1, position=7, high_watermark=7, processed=3),
        }
    )
    text = lag_metrics("m", {"orders": s})
    assert 'pidlease_mirror_lag_records{mirror="m",topic="orders",partition="0"} 5' in text
    assert 'pidlease_mirror_position{mirror="m",topic="orders",partition="1"} 7' in text
    assert 'pidlease_mirror_records_total{mirror="m",topic="orders",partition="0"} 10' in text
    assert progress_line({"orders": s}) == "mirror: copied 13, lag 5 records (orders 5)"
    unknown = ProcessorStats({0: PartitionProgress(0)})
    assert progress_line({"t": unknown}) == "mirror: copied 0, lag ? records (t ?)"


def test_metrics_endpoint_serves_the_lag() -> None:
    import urllib.error
    import urllib.request

    from pidlease.cli.mirror import _serve_metrics
    from pidlease.testing.zkserver import free_port

    s = ProcessorStats({2: PartitionProgress(2, position=4, high_watermark=9)})
    port = free_port()
    srv = _serve_metrics(port, lambda: lag_metrics("m", {"t": s}))
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            body = resp.read().decode()
        assert 'pidlease_mirror_lag_records{mirror="m",topic="t",partition="2"} 5' in body
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=5)
    finally:
        srv.shutdown()
        srv.server_close()
