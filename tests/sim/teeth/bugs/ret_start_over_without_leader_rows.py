TITLE = (
    "a follower starting over at its leader's log start does not take the leader's rows: a "
    "PID that wrote only in the skipped range is UNKNOWN_PID once it leads"
)
ORIGIN = "docs/log.md retention gap 2, a follower starting over (commit b540eed)"
PATCHES = [
    (
        "partition_server/partition.py",
        "        if leader_rows:\n            rows = {",
        "        if False and leader_rows:  # TEETH\n            rows = {",
    )
]
SEARCH = "sim"
SIM_ARGS = ["--retention"]
PYTEST = ""
BUDGET = 4000
WHY_NOT_SIM = ""
