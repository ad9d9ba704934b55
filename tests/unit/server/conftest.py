"""Fixtures of the partition-server unit tests.

- ``disk``: a ``FullDisk`` (``_disks.py``) installed as the ``os`` of ``atomic_file.py``: the
  leader-epoch file's writes fail (ENOSPC) under the directories in ``disk.full``.
"""

from __future__ import annotations

import pytest

from partition_server import atomic_file
from tests.unit.server._disks import FullDisk


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> FullDisk:
    shim = FullDisk()
    monkeypatch.setattr(atomic_file, "os", shim)
    return shim
