"""A type checker sees the public names as the real classes, not ``Any``: ``pidlease``
imports them lazily at run time, and statically under ``TYPE_CHECKING``; ``py.typed``
ships in the wheel (PEP 561)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SNIPPET = """\
from pidlease import AsyncProducer, Producer, Reader, Record, RecordMetadata, errors
reveal_type(Producer)
reveal_type(Producer("http://127.0.0.1:8470", topic="t").send(b"x"))
reveal_type(AsyncProducer)
reveal_type(Reader)
reveal_type(Record)
reveal_type(RecordMetadata)
reveal_type(errors.ProducerFenced)
"""


def test_mypy_sees_the_public_classes(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--config-file=",
            f"--cache-dir={tmp_path}",
            "-c",
            SNIPPET,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    revealed = [
        line.split("Revealed type is ", 1)[1]
        for line in out.stdout.splitlines()
        if "Revealed type is" in line
    ]
    assert out.returncode == 0 and len(revealed) == 7, out.stdout + out.stderr
    assert "Any" not in " ".join(revealed[:1] + revealed[2:]), revealed
    assert revealed[0].endswith('-> pidlease.client.producer.Producer"')
    assert (
        revealed[1] == '"concurrent.futures._base.Future[pidlease.client.structs.RecordMetadata]"'
    )
    assert revealed[3].endswith('-> pidlease.client.reader.Reader"')
    assert revealed[6].endswith('-> pidlease.errors.ProducerFenced"')


def test_py_typed_ships_with_the_package() -> None:
    assert (ROOT / "pidlease" / "py.typed").is_file()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["pidlease"]
