"""`pidlease demo` end to end with fewer records: a real cluster, connection drops and two
SIGKILLs of partition 0's leader; it must exit 0 and print the exactly-once result."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_demo_small(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pidlease.cli",
            "demo",
            "--records",
            "20000",
            "--seed",
            "7",
            "--data-dir",
            str(tmp_path / "demo"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "seed 7" in text
    assert text.count("SIGKILL server") == 2 and text.count("dropped all connections") == 4
    assert "EXACTLY-ONCE: OK" in text
    m = re.search(
        r"RESULT: records acked (\d+), present (\d+), in log (\d+), "
        r"duplicates (\d+), missing (\d+)",
        text,
    )
    assert m, text
    assert m.groups() == ("20000", "20000", "20000", "0", "0")
    assert "DEMO PASSED" in text
    assert not (tmp_path / "demo").exists() or not any((tmp_path / "demo").iterdir())
