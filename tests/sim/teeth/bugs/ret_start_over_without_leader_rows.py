TITLE = (
    "a follower starting over at its leader's log start does not take the leader's rows: a "
    "PID that wrote only in the skipped range is UNKNOWN_PID once it leads"
)
ORIGIN = "docs/log.md retention gap 2, a follower starting over (commit b540eed)"
PATCHES = [
    (
        "partition_server/rebuild.py",
        "if leader is not None and leader.rows:",
        "if False:  # TEETH: the leader's rows not taken",
    )
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/server/test_retention.py"
    "::test_a_follower_starting_over_gets_the_state_of_pids_that_wrote_only_in_the_skipped_range"
)
BUDGET = 0
WHY_NOT_SIM = (
    "not yet measured with the simulation: its run (--retention) did not get to it on "
    "2026-11-27 on the shared machine (~100 seeds/min); to measure, set SEARCH to "
    "'sim', SIM_ARGS to ['--retention'] and a budget of a few thousand seeds"
)
