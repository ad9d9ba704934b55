TITLE = "the connection guard let a newer batch pass after the first refused batch's resend"
ORIGIN = "issue 23 item 5 (the connection guard)"
# The guard's entry went at the resend of the first refused batch, so a batch newer than
# the ones held back behind it passed on the same connection before they were resent.
PATCHES = [
    (
        "partition_server/refusal_guard.py",
        "        del ranges[:i]\n",
        "        del ranges[:]\n",
    )
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/server/test_refusal_guard.py::"
    "test_the_entry_lifts_only_when_the_resends_reach_the_last_refused_batch"
)
BUDGET = 0
WHY_NOT_SIM = (
    "the simulation's producers are the SDK, which resends its refused batches in order "
    "on the connection, so the guard's entry is never skipped past"
)
