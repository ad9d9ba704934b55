"""The commands the docs tell a reader to run work from a fresh clone (issue 29): the
interpreter is the README's ``.venv/bin/python``, never a path of the machine the figures
were measured on (``/work/venv/bin/python`` in docs/benchmarks.md before)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# An absolute path into a machine's own checkouts or virtualenvs.
MACHINE_PATH = re.compile(r"/work/[\w.-]+|/home/\w+/|/Users/\w+/")


def test_docs_and_bench_usage_name_no_machine_specific_path() -> None:
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
    files += sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "bench").glob("*.py"))
    found = [
        f"{f.relative_to(ROOT)}:{n}: {line.strip()}"
        for f in files
        for n, line in enumerate(f.read_text().splitlines(), 1)
        if MACHINE_PATH.search(line)
    ]
    assert not found, "machine-specific paths (use .venv/bin/python):\n" + "\n".join(found)
    assert ".venv/bin/python -m bench.compare" in (ROOT / "docs/benchmarks.md").read_text()
