"""``python -m coordinator``: run the lease service under uvicorn with settings from
``PIDLEASE_*`` environment variables."""

from __future__ import annotations

import logging
import sys

import uvicorn

from coordinator.app import create_app
from coordinator.settings import CoordinatorSettings


def main(argv: list[str] | None = None) -> int:
    settings = CoordinatorSettings()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s {settings.coordinator_id} %(name)s %(levelname)s %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    app = create_app(settings)
    # Thousands of clients may connect at once; the default backlog of 2048 is too small.
    uvicorn.run(app, host=settings.http_host, port=settings.http_port, log_level="warning",
                access_log=False, backlog=8192, timeout_keep_alive=30, loop="auto")
    return 0


if __name__ == "__main__":
    sys.exit(main())
