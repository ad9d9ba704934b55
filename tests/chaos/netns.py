"""The nemesis suite's long form, from the command line (as root):

  python -m tests.chaos.netns --all            every nemesis, server defaults
  python -m tests.chaos.netns isolate_leader kill_leader --hold-s 20
  python -m tests.chaos.netns --list

Prints each nemesis's figures and, at the end, the Markdown table docs/reliability.md
shows; exits 1 if any check failed. tests/chaos/test_netns.py is the short form CI runs.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the chaos suite's flat modules

from netns_nemeses import NEMESES
from netns_suite import Suite, netns_cluster, table

from pidlease.testing.netns import unavailable


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.chaos.netns")
    ap.add_argument("nemeses", nargs="*", help=f"any of {', '.join(NEMESES)}")
    ap.add_argument("--all", action="store_true", help="every nemesis")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--hold-s", type=float, default=20.0, help="how long each nemesis lasts")
    ap.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="PIDLEASE_X=V",
        help="a partition-server setting (repeatable); default: the servers' defaults",
    )
    ap.add_argument("--data-dir", type=Path, default=None)
    ap.add_argument("--sdk-log", action="store_true", help="print the SDK's INFO log lines")
    args = ap.parse_args(argv)
    if args.list:
        for n in NEMESES.values():
            print(f"{n.name}: {n.what}")
        return 0
    chosen = list(NEMESES) if args.all else args.nemeses
    unknown = [n for n in chosen if n not in NEMESES]
    if not chosen or unknown:
        ap.error(f"name nemeses ({', '.join(NEMESES)}) or --all; unknown: {unknown}")
    if args.sdk_log:
        logging.basicConfig(format="%(asctime)s %(name)s %(message)s")
        logging.getLogger("pidlease.client").setLevel(logging.INFO)
    why = unavailable()
    if why:
        print(f"cannot run: {why}")
        return 2
    env = dict(kv.split("=", 1) for kv in args.server_env)
    base = args.data_dir or Path(tempfile.mkdtemp(prefix="pidlease-netns-"))
    print(f"data under {base}; server settings {env or 'defaults'}", flush=True)
    ok = True
    with netns_cluster(base, env) as (net, cluster):
        suite = Suite(net, cluster, args.hold_s)
        suite.setup()
        try:
            for name in chosen:
                res = suite.run(NEMESES[name])
                ok = ok and res.report is not None and res.report.ok
            differ = suite.identical_replicas()
            print(f"replicas byte-identical: {not differ} {differ}")
            ok = ok and not differ
        finally:
            suite.teardown()
    command = "python -m tests.chaos.netns " + " ".join(argv if argv is not None else sys.argv[1:])
    print(table(suite.results, command))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
