"""Which life of a topic a partition directory belongs to, and the removal of a deleted
topic's directories (Kafka's DeleteTopics; docs/kafka.md "Admin").

A topic deleted and created again under the same name is a new topic: it must start with
an empty log and no producer state on every replica, including one that was down when it
was deleted and still has the old directory. So each partition directory holds a small
marker, ``incarnation.json``: the topic's ``created_ms`` (the spec's, the same on every
server) and when this directory was made (``born_ms``, this server's clock). A directory
whose ``created_ms`` is not the topic's is the old topic's, and is removed like the
directory of a deleted topic.

Recovery also uses ``born_ms``: a snapshot or high-watermark checkpoint written before the
directory was made describes an older directory of that name (taken before the delete), so
it is not applied to this one; the partition's state is rebuilt from its own log.

Removal renames the directory to ``<name>.deleted.<ms>`` first (one atomic rename: a crash
after it never brings the partition back; ``partition.parse_dir_name`` does not read such a
name), then deletes the files. Leftovers are deleted at the next start.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger("partition_server.incarnation")

MARKER = "incarnation.json"
TRASH = ".deleted."


def read(directory: Path) -> tuple[int, int] | None:
    """(created_ms, born_ms) of a partition directory; None without a marker (made before
    markers existed, or a crash between mkdir and the marker)."""
    try:
        d = json.loads((directory / MARKER).read_bytes())
        return int(d["created_ms"]), int(d["born_ms"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write(directory: Path, created_ms: int, born_ms: int) -> None:
    """Blocking, but without fsyncs: a topic of 10,000 partitions opens them all in one
    go. Written before the partition's first file and replaced by a rename, so a crash
    leaves the marker whole or missing, never torn; a missing one is adopted for the topic
    ZooKeeper has (``LogManager._drop_deleted``)."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (MARKER + ".tmp")
    tmp.write_bytes(json.dumps({"created_ms": created_ms, "born_ms": born_ms}).encode())
    os.replace(tmp, directory / MARKER)


def trash(directory: Path, now_ms: int) -> Path | None:
    """Rename a partition directory out of the way (atomic); the new path, or None when it
    is not there."""
    dst = directory.with_name(f"{directory.name}{TRASH}{now_ms}")
    try:
        os.rename(directory, dst)
    except FileNotFoundError:
        return None
    return dst


def remove(path: Path) -> None:
    """Blocking: delete a trashed directory."""
    shutil.rmtree(path, ignore_errors=True)
    if path.exists():
        log.warning("could not delete all of %s", path)


def remove_leftovers(data_dir: Path) -> int:
    """Blocking: delete directories trashed before a crash. Their number."""
    n = 0
    for d in data_dir.iterdir():
        if TRASH in d.name and d.is_dir():
            remove(d)
            n += 1
    return n
