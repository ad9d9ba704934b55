"""Processes the processor tests start and SIGKILL (``python -m
tests.integration.processor_workers KIND URL ...``): the two stages of the chain
raw -> clean -> enriched, and the SQLite recipe of docs/processing.md."""

from __future__ import annotations

import logging
import sqlite3
import sys
from collections.abc import Iterator

from pidlease import Processor, Reader
from pidlease.wire.protocol import Record

PARTITIONS = 3


def clean(rec: Record) -> Iterator[tuple[bytes | None, bytes]]:
    """Stage 1, fan-out 2: every raw record becomes two, upper-cased."""
    yield rec.key, rec.value.upper() + b"/A"
    yield rec.key, rec.value.upper() + b"/B"


def enrich(rec: Record) -> Iterator[tuple[bytes | None, bytes]]:
    """Stage 2, fan-out 0..2: drops every record whose number is a multiple of 7, keeps
    one output for /B records and two for /A ones."""
    number = int(rec.value.split(b"-")[1].split(b"/")[0])
    if number % 7 == 0:
        return
    yield rec.key, rec.value + b"+e0"
    if rec.value.endswith(b"/A"):
        yield rec.key, rec.value + b"+e1"


def store_into_sqlite(url: str, topic: str, db_path: str) -> None:
    """The recipe of docs/processing.md: each partition's records go into a table with the
    next input offset in the same transaction; a restart reads the offsets back."""
    db = sqlite3.connect(db_path, isolation_level=None)
    db.execute("CREATE TABLE IF NOT EXISTS events (part INT, off INT, key BLOB, value BLOB)")
    db.execute("CREATE TABLE IF NOT EXISTS positions (part INT PRIMARY KEY, next INT)")
    for partition in range(PARTITIONS):
        row = db.execute("SELECT next FROM positions WHERE part = ?", (partition,)).fetchone()
        start = row[0] if row else 0
        with Reader(url, topic, partition, start_offset=start) as reader:
            pending: list[Record] = []
            for rec in reader:
                pending.append(rec)
                if len(pending) == 50:
                    _commit(db, partition, pending, reader.position)
                    pending = []
            _commit(db, partition, pending, reader.position)


def _commit(db: sqlite3.Connection, partition: int, recs: list[Record], nxt: int) -> None:
    db.execute("BEGIN")
    db.executemany(
        "INSERT INTO events VALUES (?, ?, ?, ?)",
        [(partition, r.offset, r.key, r.value) for r in recs],
    )
    db.execute("INSERT OR REPLACE INTO positions VALUES (?, ?)", (partition, nxt))
    db.execute("COMMIT")


def main(argv: list[str]) -> int:
    kind, url = argv[0], argv[1]
    if kind == "sqlite":
        store_into_sqlite(url, argv[2], argv[3])
        return 0
    until = "--until-caught-up" in argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if kind == "clean":
        Processor(url, "raw", "clean", "cleaner", clean, fanout_max=2, until_caught_up=until).run()
    elif kind == "clean-group":  # instances share raw's partitions through the group
        Processor(
            url,
            "raw",
            "clean",
            "cleaner",
            clean,
            fanout_max=2,
            group=True,
            session_timeout_ms=6000,
        ).run()
    elif kind == "share":  # no group flag: the default, instances of a name share
        # share URL INPUT OUTPUT NAME [TOKEN CA_FILE]
        token, ca = (argv[5], argv[6]) if len(argv) > 6 else (None, None)
        Processor(
            url,
            argv[2],
            argv[3],
            argv[4],
            clean,
            fanout_max=2,
            session_timeout_ms=6000,
            api_token=token,
            tls_ca_file=ca,
        ).run()
    elif kind == "enrich":
        Processor(
            url, "clean", "enriched", "enricher", enrich, fanout_max=2, until_caught_up=until
        ).run()
    else:
        raise SystemExit(f"unknown worker {kind}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
