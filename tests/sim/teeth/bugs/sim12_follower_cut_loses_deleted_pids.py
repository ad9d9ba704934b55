TITLE = (
    "a follower's cut with its log start above 0 loses the PIDs whose committed batches were "
    "all deleted and whose other batches were in the cut range (UNKNOWN_PID once it leads)"
)
ORIGIN = "docs/reliability.md sim finding 12 (seed 1863 --retention)"
PATCHES = [
    (
        "partition_server/rebuild.py",
        "in_log = pids_with_data(plog.iter_headers(0), end)",
        "in_log = pids_with_data(plog.iter_headers(0), plog.next_offset)  # TEETH: cut ones count",
    )
]
SEARCH = "sim"
SIM_ARGS = ["--retention"]
PYTEST = ""
BUDGET = 5000
WHY_NOT_SIM = ""
