"""What the wheel installs, read from the build backend itself: setuptools' ``egg_info``
(the metadata step of every build and of ``pip install``; the PEP 517 metadata hook runs
it too, then needs the ``wheel`` package, which setuptools 65 does not bundle) gives the
top-level names a user's site-packages receives, the files of the Spark data source and
the console commands, from ``pyproject.toml`` as a build reads it.

A user's project may have a package of any generic name (``pipeline`` was ours until
issue 28 item 5); the wheel installs only ``pidlease`` and the two services the design
names, ``coordinator`` and ``partition_server``.
"""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TOP_LEVEL = {"pidlease", "coordinator", "partition_server"}
_SETUP = "from setuptools import setup; setup()"  # reads pyproject.toml


@pytest.fixture(scope="module")
def egg_info(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("metadata")
    done = subprocess.run(
        [sys.executable, "-c", _SETUP, "-q", "egg_info", "--egg-base", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    [found] = out.glob("*.egg-info")
    return found


def test_the_wheel_installs_no_generic_top_level_name(egg_info: Path) -> None:
    names = set((egg_info / "top_level.txt").read_text().split())
    assert names == TOP_LEVEL


def test_the_spark_data_source_ships_inside_pidlease(egg_info: Path) -> None:
    files = set((egg_info / "SOURCES.txt").read_text().split())
    spark = {f for f in files if f.startswith("pidlease/spark/")}
    on_disk = {p.relative_to(ROOT).as_posix() for p in (ROOT / "pidlease/spark").glob("*.py")}
    assert on_disk <= spark
    assert "pidlease/spark/source.py" in spark  # what Spark's Python workers import by name
    assert not [f for f in files if f.startswith("pipeline/")]


def test_pidlease_spark_command_points_at_pidlease_spark(egg_info: Path) -> None:
    entry = configparser.ConfigParser()
    entry.read(egg_info / "entry_points.txt")
    assert dict(entry["console_scripts"]) == {
        "pidlease": "pidlease.cli.commands:main",
        "pidlease-spark": "pidlease.spark.cli:main",
    }
