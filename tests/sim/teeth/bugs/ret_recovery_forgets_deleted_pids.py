TITLE = (
    "recovery from a distrusted snapshot rebuilds from the log start only: PIDs whose batches "
    "retention deleted are forgotten (UNKNOWN_PID)"
)
ORIGIN = "docs/log.md retention gap 1, recovery from a snapshot taken before a cut (commit 2e5900a)"
PATCHES = [
    (
        "partition_server/partition.py",
        'restore_deleted_only(state, distrusted.rows, plog, f"{topic}-{partition}")',
        "pass  # TEETH: nothing restored from the snapshot",
    )
]
SEARCH = "sim"
SIM_ARGS = ["--retention"]
PYTEST = ""
BUDGET = 4000
WHY_NOT_SIM = ""
