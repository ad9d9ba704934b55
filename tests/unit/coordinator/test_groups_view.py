"""The dashboard's consumer groups and ``pidlease_group_lag`` (issue 25): the lag of each
committed partition is its high watermark minus the commit, unknown when its leader did
not report, never negative; a server that does not answer is named, the others still
shown; label values are escaped as Prometheus text requires."""

from __future__ import annotations

from typing import Any

from coordinator.groups_view import GroupsView, lag_rows
from coordinator.metrics import Metrics
from pidlease.wire.cluster import ServerInfo


def group(name: str, offsets: list[tuple[str, int, int]], **kw: Any) -> dict[str, Any]:
    return {
        "group": name,
        "state": kw.get("state", "Stable"),
        "members": kw.get("members", 2),
        "coordinator": kw.get("coordinator", "127.0.0.1:9092"),
        "offsets": [{"topic": t, "partition": p, "committed": o} for t, p, o in offsets],
    }


def test_lag_is_the_high_watermark_minus_the_commit() -> None:
    hws = {("orders", 0): 100, ("orders", 1): 40, ("orders", 2): -1}
    rows = lag_rows(
        [
            group("b", [("orders", 0, 30), ("orders", 1, 45), ("orders", 2, 5), ("gone", 0, 1)]),
            group("a", [], state="Empty", members=0),
        ],
        hws,
    )
    got = [(r["group"], r["topic"], r["partition"], r["committed"], r["lag"]) for r in rows]
    assert got == [
        ("a", None, None, None, None),  # a group without commits: one row
        ("b", "orders", 0, 30, 70),
        ("b", "orders", 1, 45, 0),  # a commit ahead of a lagging leader's report: not -5
        ("b", "orders", 2, 5, None),  # the leader did not say
        ("b", "gone", 0, 1, None),  # no such partition reported
    ]
    assert rows[1]["high_watermark"] == 100 and rows[1]["members"] == 2


def test_a_silent_server_is_named_and_the_others_shown() -> None:
    servers = [
        ServerInfo(1, "127.0.0.1", 1, kafka_port=9001),
        ServerInfo(2, "127.0.0.1", 2, kafka_port=9002),
        ServerInfo(3, "127.0.0.1", 3, kafka_port=0),  # no Kafka listener: not asked
    ]
    asked: list[str] = []

    def fetch(address: str, timeout_s: float) -> list[dict[str, Any]]:
        asked.append(address)
        if address.endswith(":9002"):
            raise ConnectionRefusedError(111, "Connection refused")
        return [group("g1", [("t", 0, 1)], coordinator=address)]

    view = GroupsView(lambda: servers, timeout_ms=1000, fetch=fetch)
    try:
        groups, silent = view.survey()
    finally:
        view.close()
    assert sorted(asked) == ["127.0.0.1:9001", "127.0.0.1:9002"]
    assert [g["group"] for g in groups] == ["g1"]
    assert len(silent) == 1 and silent[0].startswith("server 2:") and "refused" in silent[0]
    assert view.failures == 1


def test_group_lag_samples_render_with_escaped_labels() -> None:
    m = Metrics()
    m.multi_labelled["pidlease_group_lag"] = (
        "lag",
        lambda: [({"group": 'we"ird\\g\nx', "topic": "t", "partition": "0"}, 7)],
    )
    text = m.render()
    assert "# TYPE pidlease_group_lag gauge" in text
    assert 'pidlease_group_lag{group="we\\"ird\\\\g\\nx",topic="t",partition="0"} 7' in text
    m.multi_labelled["pidlease_group_lag"] = ("lag", lambda: None)
    assert "pidlease_group_lag" not in m.render(), "nothing known yet: left out"
