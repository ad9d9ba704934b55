"""docs/settings.md is the one table of every setting; it must match the settings classes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def test_settings_table_is_current() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "settings_table.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,  # the assert below shows the script's output on failure
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_setting_has_a_meaning() -> None:
    rows = [
        line
        for line in (ROOT / "docs" / "settings.md").read_text().splitlines()
        if line.startswith(("| both", "| coordinator", "| partition server"))
    ]
    assert len(rows) > 30
    blank = [
        r.split("|")[2].strip()
        for r in rows
        if not r.rstrip("| ").split("|")[-1].strip() or r.endswith("|  |")
    ]
    assert not blank, f"settings without a meaning: {blank}"


def test_a_shared_name_with_two_defaults_needs_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """A setting both services read from one environment variable, outside the shared base
    (pidlease/wire/service_settings.py), with no reason for its two defaults, stops the
    table (issue 28: PIDLEASE_ZK_SESSION_TIMEOUT_MS was 10,000 and 1,200 unexplained)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import settings_table

    assert "zk_session_timeout_ms" in "\n".join(settings_table._different_defaults_section())
    monkeypatch.setattr(settings_table, "DIFFERENT_DEFAULTS", {})
    with pytest.raises(SystemExit, match="zk_session_timeout_ms"):
        settings_table._different_defaults_section()


def test_both_services_share_one_base() -> None:
    from coordinator.settings import CoordinatorSettings
    from partition_server.settings import ServerSettings
    from pidlease.wire.service_settings import ServiceSettings

    for cls in (CoordinatorSettings, ServerSettings):
        assert issubclass(cls, ServiceSettings)
        for name, field in ServiceSettings.model_fields.items():
            assert cls.model_fields[name].default == field.default, (cls, name)
