TITLE = "a takeover answered OK while a leased partition (no state, may not create) stayed unfenced"
ORIGIN = "issue 30 item 4"
# The coordinator judged only the requested partition's FENCE answer: another partition of
# the lease that answered "existed=false, nothing written" was skipped, and the old holder
# could append there at the old generation (any sequence on a monotonic topic).
# Also caught on a real cluster by tests/integration/test_coordinator_takeover.py::
# test_takeover_never_answers_ok_with_a_leased_partition_left_unfenced.
PATCHES = [
    (
        "coordinator/leases.py",
        "    for other in unfenced(answers, untracked, also=[tp, *record.partitions]):",
        "    for other in unfenced(answers, untracked, also=[tp])[:0]:",
    )
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/coordinator/test_service.py::"
    "test_takeover_with_a_leased_partition_left_unfenced_is_unknown_pid"
)
BUDGET = 0
WHY_NOT_SIM = "the simulation does not run the coordinator"
