TITLE = (
    "a follower starting over adopted only the leader's rows of PIDs with no batch left in "
    "its log: a PID that also wrote above the log start kept the follower's older batches, "
    "and once it led, a resend of a committed Kafka batch the leader answered DUPLICATE was "
    "OUT_OF_ORDER_SEQUENCE"
)
ORIGIN = "docs/reliability.md sim finding s23.1 (seed 500201, CI short form after issues 27-29)"
PATCHES = [
    (
        "partition_server/rebuild.py",
        "rows = [r for r in (row_below(row, start) for row in state.export_rows())"
        " if r is not None]",
        "rows = state.export_rows(state.pids_written_below(start))  # TEETH",
    )
]
SEARCH = "sim"
# Found at seed 500201 (the CI short form's range) on the merged tree.
SIM_ARGS = ["--retention", "--start", "500201"]
PYTEST = ""
BUDGET = 50
WHY_NOT_SIM = ""
