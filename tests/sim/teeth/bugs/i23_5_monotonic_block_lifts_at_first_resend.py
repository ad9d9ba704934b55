TITLE = "a monotonic block lifted at the first resend, forgetting the batches refused behind it"
ORIGIN = "issue 23 item 5"
# Batch N refused (disk full), N+1.. refused behind it, only N resent: the block lifted,
# a newer batch was appended above the never-resent N+1.., and once K more batches were
# kept their resend was answered DUPLICATE with offset -1 (acked, not in the log).
PATCHES = [
    (
        "partition_server/producer_state.py",
        "                self._resent(pid, base_seq + count - 1)",
        "                self._unblock(pid)",
    )
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/server/test_producer_state_property.py::"
    "test_monotonic_refused_run_skipped_is_not_duplicate_without_a_restart"
)
BUDGET = 0
WHY_NOT_SIM = (
    "the simulation's producers are the SDK, which resends every refused batch in order "
    "before any newer one; only a client of the binary protocol that skips a resend or "
    "switches connections reaches it"
)
