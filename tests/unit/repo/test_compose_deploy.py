"""deploy/ stays true to the code: every variable in the example settings file is a setting
some service reads, the systemd units run commands the CLI has, and every metric the
Prometheus alerts use is one the coordinator or a partition server exports."""

from __future__ import annotations

import configparser
import re
from pathlib import Path
from typing import ClassVar

from coordinator.metrics import Metrics
from coordinator.settings import CoordinatorSettings
from partition_server.metrics import ServerMetrics, parse_text, watch_log_manager
from partition_server.settings import ServerSettings
from pidlease.cli.commands import build_parser

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"


def known_settings() -> set[str]:
    return {
        "PIDLEASE_" + n.upper()
        for s in (CoordinatorSettings, ServerSettings)
        for n in s.model_fields
    }


def test_example_settings_are_all_real() -> None:
    text = (DEPLOY / "pidlease.env.example").read_text()
    names = re.findall(r"^#?(PIDLEASE_[A-Z0-9_]+)=", text, flags=re.MULTILINE)
    assert len(names) > 10
    unknown = sorted(set(names) - known_settings())
    assert not unknown, f"ignored by every service: {unknown}"


def test_systemd_units_run_commands_the_cli_has() -> None:
    commands = set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    for unit in sorted((DEPLOY / "systemd").glob("*.service")):
        cfg = configparser.ConfigParser(strict=False, interpolation=None)
        cfg.read(unit)
        service = cfg["Service"]
        argv = service["ExecStart"].split()
        assert argv[0].endswith("/pidlease") and argv[1] in commands, unit.name
        assert service["EnvironmentFile"] == "/etc/pidlease/pidlease.env"
        assert service["User"] == "pidlease" and service["Restart"] == "on-failure"
        assert int(service["TimeoutStopSec"]) >= 20
        assert cfg["Install"]["WantedBy"] == "multi-user.target"


class _Broker:
    partitions: ClassVar[dict[object, object]] = {}
    snapshots_taken = 0
    _last_snapshot_ms = 0

    @staticmethod
    def clock_ms() -> int:
        return 0


def exported_names() -> set[str]:
    server = ServerMetrics(1)
    watch_log_manager(server, _Broker())
    coordinator = Metrics()
    names = {name for name, _ in parse_text(server.render())}
    names |= {name for name, _ in parse_text(coordinator.render())}
    names |= set(re.findall(r"^# TYPE (\S+)", server.render(), flags=re.MULTILINE))
    # Gauges the coordinator registers in app.py, and the histogram families.
    app = (ROOT / "coordinator" / "app.py").read_text()
    names |= set(re.findall(r'"(pidlease_[a-z_]+)"', app))
    return names | {n + "_bucket" for n in names}


def test_alerts_use_only_exported_metrics() -> None:
    text = (DEPLOY / "prometheus" / "alerts.yml").read_text()
    exprs = re.findall(r"^\s+expr: (.+)$", text, flags=re.MULTILINE)
    assert len(exprs) >= 8
    used = {m for e in exprs for m in re.findall(r"\b(pidlease_[a-z_]+)", e)}
    missing = sorted(used - exported_names())
    assert not missing, missing
