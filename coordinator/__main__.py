"""``python -m coordinator``: run the lease service under uvicorn with settings from
``PIDLEASE_*`` environment variables."""

from __future__ import annotations

import logging
import sys
from typing import Any

import uvicorn
from pydantic import ValidationError

from coordinator.app import create_app
from coordinator.settings import CoordinatorSettings
from pidlease.wire.tls import peer_ssl_context, server_ssl_context

log = logging.getLogger("coordinator")


def main(argv: list[str] | None = None) -> int:
    try:
        settings = CoordinatorSettings()
    except ValidationError as exc:
        print(f"coordinator: bad settings: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s {settings.coordinator_id} %(name)s %(levelname)s %(message)s",
    )
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    tls: dict[str, Any] = {}  # uvicorn.run's ssl_* keywords
    if settings.tls_certfile:
        # Load both now: a bad file stops the start with its name, not a traceback.
        try:
            server_ssl_context(settings.tls_certfile, settings.tls_keyfile)
            peer_ssl_context(settings.tls_certfile, settings.tls_ca_file)
        except ValueError as exc:
            log.error("bad TLS settings: %s", exc)
            return 2
        tls = {"ssl_certfile": settings.tls_certfile, "ssl_keyfile": settings.tls_keyfile}
    # The Coordinator builds its TLS client context for the partition servers itself.
    app = create_app(settings)
    # Thousands of clients may connect at once; the default backlog of 2048 is too small.
    uvicorn.run(
        app,
        host=settings.http_host,
        port=settings.http_port,
        log_level="warning",
        access_log=False,
        backlog=8192,
        timeout_keep_alive=30,
        loop="auto",
        **tls,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
