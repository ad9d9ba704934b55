TITLE = (
    "a follower's cut rebuilds producer state from its log start only: the PIDs whose "
    "batches retention deleted are forgotten (UNKNOWN_PID once it leads)"
)
ORIGIN = "docs/log.md retention on replicas (commit 8e85b0a)"
PATCHES = [
    (
        "partition_server/partition.py",
        "kept = rebuild.rows_kept_through_cut(self.state, self.log, end)",
        "kept = None  # TEETH: only the log's PIDs rebuilt",
    )
]
SEARCH = "sim"
SIM_ARGS = ["--retention"]
PYTEST = ""
BUDGET = 5000
WHY_NOT_SIM = ""
