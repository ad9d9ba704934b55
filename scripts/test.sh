#!/usr/bin/env bash
# Run every test (unit, then integration against a real local ZooKeeper and real servers).
# Usage: scripts/test.sh [pytest args]     (expects .venv from scripts/setup.sh or .ci/run)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
exec timeout 3600 "$PY" -m pytest tests -q -p no:cacheprovider --durations=40 "$@"
