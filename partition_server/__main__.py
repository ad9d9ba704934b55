"""``python -m partition_server``: run one partition server configured by PIDLEASE_* env."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from pydantic import ValidationError

from partition_server.server import PartitionServer
from partition_server.settings import ServerSettings

log = logging.getLogger("partition_server")


async def _run(settings: ServerSettings) -> None:
    server = PartitionServer(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    await stop.wait()
    log.info("stopping on signal")
    await server.stop()


def main() -> int:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    try:
        settings = ServerSettings()
    except ValidationError as exc:
        log.error("bad settings: %s", exc)
        return 2
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        try:
            runner.run(_run(settings))
        except OSError as exc:  # a port in use, an unreachable address: one clear line
            log.error("cannot start: %s", exc)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
