TITLE = (
    "recovery after a cut forgot a PID whose K kept batches were all cut: the snapshot "
    "rows carried no durable highwater, so restore_deleted_only dropped the row "
    "(UNKNOWN_PID, or sequence 0 through a takeover with create-if-absent)"
)
ORIGIN = "issue 23 item 4"
# The durable highwater the snapshot recorded is ignored: the behaviour of a PLSNAP04 file.
PATCHES = [
    (
        "partition_server/rebuild.py",
        "kept = cut_row(row, start, image.durable_highwater(pid, row[2]))",
        "kept = cut_row(row, start, None)",
    )
]
SEARCH = "sim"
SIM_ARGS = ["--retention"]
PYTEST = ""
BUDGET = 3000
WHY_NOT_SIM = ""
# Found by tests/unit/test_rebuild.py::test_recovery_after_a_cut_of_more_than_k_batches_keeps_
# the_committed_highwater (UNKNOWN_PID where APPEND).
# Seen by the current simulation (s22-rebuild, before the "sim" helper's extension): NOT
# found in 300 seeds of `run --retention --stop-on-failure` (0 failed); the lead re-checks.
