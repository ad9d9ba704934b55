TITLE = (
    "a fence counted as a data batch: a PID whose data batches retention deleted, then "
    "fenced by a takeover, was rebuilt from the fence alone (highwater -1) by a cut or a "
    "recovery from a distrusted snapshot, and the next takeover restarted it at sequence 0"
)
ORIGIN = "issue 23 item 2"
PATCHES = [
    (
        "partition_server/producer_state.py",
        "return {h.pid for h in headers if not h.is_control and h.base_offset < end}",
        "return {h.pid for h in headers if h.base_offset < end}",
    )
]
SEARCH = "sim"
SIM_ARGS = ["--retention", "--no-zk3", "--start", "500000"]
PYTEST = ""
BUDGET = 3000
WHY_NOT_SIM = ""
# Found by the unit test tests/unit/server/test_rebuild.py::test_a_cut_keeps_the_highwater_of_a_pid_
# whose_only_batch_left_is_a_fence (and ..._recovery_from_a_distrusted_snapshot_...) and the
# integration test tests/integration/test_rebuild_cluster.py (last_sequence_id -1, not 2).
# Seen by the current simulation (s22-rebuild, before the "sim" helper's extension): NOT
# found in 300 seeds of `run --retention --stop-on-failure` (0 failed); the lead re-checks.
# 2026-11-27 (after the fix of seed 501223, finding 16): found at seed 500745 (746 seeds,
# 430 s at 106 seeds/min on the loaded machine), "producer L7 (strict) failed: batch [6..6]
# answered OUT_OF_ORDER_SEQUENCE: ... expected 0 next"; 500745 passes without the patch.
