TITLE = (
    "recovery from a distrusted snapshot restores a deleted PID's row whole, batches cut "
    "since included: their resend is answered DUPLICATE, never written"
)
ORIGIN = "docs/log.md retention gap 1, the filter below the log start (commit 2e5900a)"
PATCHES = [
    (
        "partition_server/rebuild.py",
        "kept = cut_row(row, start, image.durable_highwater(pid, row[2]))",
        "kept = row  # TEETH: cut batches kept",
    )
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/server/test_retention.py"
    "::test_recovery_from_a_snapshot_taken_before_a_cut_keeps_pids_only_retention_deleted"
)
BUDGET = 0
WHY_NOT_SIM = (
    "not yet measured with the simulation: its run (--retention) did not get to it on "
    "2026-11-27 on the shared machine (~100 seeds/min); to measure, set SEARCH to "
    "'sim', SIM_ARGS to ['--retention'] and a budget of a few thousand seeds"
)
