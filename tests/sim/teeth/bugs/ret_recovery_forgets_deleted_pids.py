TITLE = (
    "recovery from a distrusted snapshot rebuilds from the log start only: PIDs whose batches "
    "retention deleted are forgotten (UNKNOWN_PID)"
)
ORIGIN = "docs/log.md retention gap 1, recovery from a snapshot taken before a cut (commit 2e5900a)"
PATCHES = [
    (
        "partition_server/rebuild.py",
        "restore_deleted_only(state, distrusted, plog, name)",
        "pass  # TEETH: nothing restored from the snapshot",
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
    "not yet measured with the simulation: its run (--retention) was stopped after "
    "about 4 minutes on "
    "2026-11-27 on the shared machine (~100 seeds/min); to measure, set SEARCH to "
    "'sim', SIM_ARGS to ['--retention'] and a budget of a few thousand seeds"
)
