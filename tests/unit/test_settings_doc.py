"""docs/settings.md is the one table of every setting; it must match the settings classes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
        if line.startswith(("| coordinator", "| partition server"))
    ]
    assert len(rows) > 30
    blank = [
        r.split("|")[2].strip()
        for r in rows
        if not r.rstrip("| ").split("|")[-1].strip() or r.endswith("|  |")
    ]
    assert not blank, f"settings without a meaning: {blank}"
