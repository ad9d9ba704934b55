"""docs/testing.md's module -> test index must match the tests (scripts/test_index.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
sys.path.insert(0, str(ROOT / "scripts"))

import test_index  # noqa: E402


def test_module_test_index_is_current() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "test_index.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,  # the assert below shows the script's output on failure
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_index_names_the_file_named_after_a_module_and_its_importers() -> None:
    index = test_index.render_index()
    row = next(r for r in index.splitlines() if r.startswith("| `pidlease.wire.pid_blocks` |"))
    assert "coordinator/test_allocator.py" in row  # imports it
    row = next(r for r in index.splitlines() if r.startswith("| `partition_server.log` |"))
    assert "**`unit/" in row and "server/test_log.py`**" in row  # named after it, first, in bold
    assert all(r.count("|") >= 4 for r in index.splitlines() if r.startswith("| `"))


def test_render_keeps_the_prose_around_the_index() -> None:
    doc = "# Testing\n\nprose\n\n" + test_index.START + "\nold\n" + test_index.END + "\n\nafter\n"
    out = test_index.render(doc)
    assert out.startswith("# Testing\n\nprose\n\n" + test_index.START)
    assert out.endswith(test_index.END + "\n\nafter\n") and "\nold\n" not in out
