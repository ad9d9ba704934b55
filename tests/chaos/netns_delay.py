"""A user-space delayer for one host's link: the kernel here has no ``netem``, so the host's
packets go through an NFQUEUE (``Network.queue``) and this program, started in the same
namespace, holds each one ``--delay-ms`` and drops ``--loss`` of them at random.

netfilterqueue (PyPI, built against Debian's libnetfilter-queue-dev) lets a verdict be
given after the callback returns, so packets are held in a heap, not by sleeping in the
callback: the delay is constant and throughput is not one packet per delay.

Usage (as root, inside the host's namespace):
  python tests/chaos/netns_delay.py --queue 7 --delay-ms 200 --loss 0.1 [--seed N]
Prints "ready" once bound; on SIGTERM prints the counts and accepts what it still holds.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import select
import signal
import socket
import sys
import time
from typing import Any


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queue", type=int, required=True)
    ap.add_argument("--delay-ms", type=float, default=200.0)
    ap.add_argument("--loss", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args(argv)
    from netfilterqueue import NetfilterQueue

    rng = random.Random(args.seed)
    held: list[tuple[float, int, Any]] = []
    order = itertools.count()  # ties keep arrival order
    counts = {"seen": 0, "dropped": 0, "passed": 0}
    delay_s = args.delay_ms / 1000.0

    def on_packet(pkt: Any) -> None:
        counts["seen"] += 1
        if rng.random() < args.loss:
            counts["dropped"] += 1
            pkt.drop()
            return
        heapq.heappush(held, (time.monotonic() + delay_s, next(order), pkt))

    stopping = [False]

    def stop(*_: object) -> None:
        stopping[0] = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    nfq = NetfilterQueue()
    nfq.bind(args.queue, on_packet, max_len=50_000)
    sock = socket.fromfd(nfq.get_fd(), socket.AF_UNIX, socket.SOCK_STREAM)
    print("ready", flush=True)
    try:
        while not stopping[0]:
            now = time.monotonic()
            while held and held[0][0] <= now:
                heapq.heappop(held)[2].accept()
                counts["passed"] += 1
            wait = min(0.05, held[0][0] - now) if held else 0.05
            ready, _, _ = select.select([sock], [], [], max(0.0, wait))
            if ready:
                nfq.run(block=False)
    finally:
        for _, _, pkt in held:  # let what is held go: the host must not stay cut
            pkt.accept()
        nfq.unbind()
        sock.close()
        print(f"delayer counts {counts}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
