"""``pidlease-spark``: publish data sets exactly once and audit a topic (issue 8, pending)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("pidlease-spark: the Spark pipeline is not built yet (issue 8). "
          "Use `pidlease produce` and `pidlease verify` meanwhile.", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
