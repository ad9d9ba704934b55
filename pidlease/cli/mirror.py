"""``pidlease mirror``: copy topics from one cluster to another, effectively once
(``pidlease/client/mirror.py``; docs/cli.md, docs/processing.md)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pidlease.client.mirror import Endpoint, Mirror, lag_metrics, prepare_topics, progress_line
from pidlease.client.processor import ProcessorStats

EPILOG = """\
examples:
  pidlease mirror --source http://dc1:8470 --target http://dc2:8470 --topics orders,payments
  pidlease mirror --source URL --target URL --topics orders --until-caught-up   # exit 0 when done
  pidlease mirror ... --metrics-port 9470     # Prometheus text at http://127.0.0.1:9470/metrics

Killed and restarted with the same --name, it resumes where the target says it stopped:
every source record lands exactly once, in order, with its key, value and timestamp.
Instances started with the same --name share the source partitions through the consumer
group named after it (on the source cluster) and take over a dead one's; --no-group (or
--instance/--instances, or --until-caught-up) assigns partitions statically instead.
"""


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    m = sub.add_parser(
        "mirror",
        help="copy topics to another cluster, exactly once, resuming after crashes",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    m.add_argument("--source", metavar="URL", required=True, help="source coordinator URL")
    m.add_argument("--target", metavar="URL", required=True, help="target coordinator URL")
    m.add_argument("--topics", required=True, help="comma-separated topic names")
    m.add_argument(
        "--name",
        default="mirror",
        help="the mirror's name: its producers are NAME/TOPIC/PARTITION (default %(default)s)",
    )
    m.add_argument(
        "--until-caught-up",
        action="store_true",
        help="exit 0 once the target holds everything the source held at start",
    )
    for side in ("source", "target"):
        env = f"PIDLEASE_{side.upper()}"
        m.add_argument(
            f"--{side}-api-token",
            metavar="TOKEN",
            default=os.environ.get(f"{env}_API_TOKEN"),
            help=f"the {side} coordinator's API token (env {env}_API_TOKEN)",
        )
        m.add_argument(
            f"--{side}-tls-ca-file",
            metavar="PEM",
            default=os.environ.get(f"{env}_TLS_CA_FILE") or None,
            help=f"CA bundle for the {side}'s TLS servers / https coordinator "
            f"(env {env}_TLS_CA_FILE)",
        )
    m.add_argument(
        "--replication-factor",
        type=int,
        help="for target topics created by the mirror (default: the source topic's)",
    )
    m.add_argument("--instance", type=int, default=0, help="this instance's index (static split)")
    m.add_argument(
        "--instances", type=int, default=1, help="instances sharing --name (static split)"
    )
    grp = m.add_mutually_exclusive_group()
    grp.add_argument(
        "--group",
        action="store_true",
        help="instances sharing --name split the partitions through the consumer group "
        "named after it, and take over a dead one's (the default unless a static flag is "
        "given; kept for scripts that said it)",
    )
    grp.add_argument(
        "--no-group",
        action="store_true",
        help="no consumer group: this instance takes every partition (or its "
        "--instance/--instances share); for a source without a Kafka listener",
    )
    m.add_argument("--metrics-port", type=int, help="serve Prometheus text on 127.0.0.1:PORT")
    m.add_argument(
        "--progress-interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="print progress and lag to stderr this often (0: never; default %(default)s)",
    )
    m.set_defaults(func=cmd_mirror)


def _serve_metrics(port: int, render: Callable[[], str]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.rstrip("/") != "/metrics":
                self.send_error(404)
                return
            body = render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def group_choice(args: argparse.Namespace) -> bool | None:
    """``--group``: True; ``--no-group``: False; neither: None, the processors' default
    (the group, unless --instances or --until-caught-up ask for the static assignment)."""
    return True if args.group else (False if args.no_group else None)


def cmd_mirror(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    topics = [t.strip() for t in args.topics.split(",") if t.strip()]
    if not topics:
        print("error: --topics names no topic", file=sys.stderr)
        return 2
    source = Endpoint(args.source, args.source_api_token, args.source_tls_ca_file)
    target = Endpoint(args.target, args.target_api_token, args.target_tls_ca_file)
    made = prepare_topics(source, target, topics, replication_factor=args.replication_factor)
    for t, (n, created) in made.items():
        if created:
            print(f"created target topic {t} with {n} partitions (dedup monotonic)")
    mirror = Mirror(
        source,
        target,
        topics,
        name=args.name,
        until_caught_up=args.until_caught_up,
        instance=args.instance,
        instances=args.instances,
        group=group_choice(args),
    )
    srv = None
    if args.metrics_port is not None:
        srv = _serve_metrics(args.metrics_port, lambda: lag_metrics(args.name, mirror.stats))

    def progress(stats: dict[str, ProcessorStats]) -> None:
        print(progress_line(stats), file=sys.stderr, flush=True)

    async def main() -> dict[str, ProcessorStats]:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, mirror.stop)
        return await mirror.run(
            on_progress=progress if args.progress_interval > 0 else None,
            progress_interval_s=args.progress_interval or 5.0,
        )

    try:
        stats = asyncio.run(main())
    finally:
        if srv is not None:
            srv.shutdown()
            srv.server_close()
    copied = sum(pp.processed for s in stats.values() for pp in s.partitions.values())
    state = "caught up" if args.until_caught_up else "stopped"
    print(f"mirrored {copied} records of {', '.join(topics)} as {args.name!r}: {state}")
    print(progress_line(stats), file=sys.stderr)
    return 0
