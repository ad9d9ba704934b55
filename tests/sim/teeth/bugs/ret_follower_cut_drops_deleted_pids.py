TITLE = (
    "a follower's cut rebuilds producer state from its log start only: the PIDs whose "
    "batches retention deleted are forgotten (UNKNOWN_PID once it leads)"
)
ORIGIN = "docs/log.md retention on replicas (commit 8e85b0a)"
PATCHES = [
    (
        "partition_server/partition.py",
        "kept = self._rows_kept_through_cut(end)",
        "kept: list[Row] = []  # TEETH",
    )
]
SEARCH = "sim"
SIM_ARGS = ["--retention"]
PYTEST = ""
BUDGET = 5000
WHY_NOT_SIM = ""
