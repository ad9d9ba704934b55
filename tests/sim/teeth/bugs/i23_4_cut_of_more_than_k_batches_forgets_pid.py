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
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/test_rebuild.py::test_recovery_after_a_cut_of_more_than_k_batches_keeps_the_c"
    "ommitted_highwater"
)
BUDGET = 1
WHY_NOT_SIM = (
    "the --retention search from seed 500000 first meets seed 501223, which fails on the "
    "unpatched tree too (a Kafka batch acked at offset 56 of t2-1 and not in the log: an open"
    " finding, docs/reliability.md); the sim found this hole on the old code (seed 500047) "
    "but a search that fails without the patch proves nothing, so its unit test searches "
    "until 501223 is fixed"
)
# Found by tests/unit/test_rebuild.py::test_recovery_after_a_cut_of_more_than_k_batches_keeps_
# the_committed_highwater (UNKNOWN_PID where APPEND).
# Seen by the current simulation (s22-rebuild, before the "sim" helper's extension): NOT
# found in 300 seeds of `run --retention --stop-on-failure` (0 failed); the lead re-checks.
