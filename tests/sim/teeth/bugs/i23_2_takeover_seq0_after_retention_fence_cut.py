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
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/test_rebuild.py::test_a_cut_keeps_the_highwater_of_a_pid_whose_only_batch_lef"
    "t_is_a_fence"
)
BUDGET = 1
WHY_NOT_SIM = (
    "the --retention search from seed 500000 first meets seed 501223, which fails on the "
    "unpatched tree too (a Kafka batch acked at offset 56 of t2-1 and not in the log: an open"
    " finding, docs/reliability.md); the sim found this hole on the old code (seed 500047) "
    "but a search that fails without the patch proves nothing, so its unit test searches "
    "until 501223 is fixed"
)
# Found by the unit test tests/unit/test_rebuild.py::test_a_cut_keeps_the_highwater_of_a_pid_
# whose_only_batch_left_is_a_fence (and ..._recovery_from_a_distrusted_snapshot_...) and the
# integration test tests/integration/test_rebuild_cluster.py (last_sequence_id -1, not 2).
# Seen by the current simulation (s22-rebuild, before the "sim" helper's extension): NOT
# found in 300 seeds of `run --retention --stop-on-failure` (0 failed); the lead re-checks.
