TITLE = (
    "a group member's session ran from its JoinGroup request, not from the answer: members "
    "that waited out a long rebalance were expired at once and the group never settled"
)
ORIGIN = "issue 25 item 1"
PATCHES = [
    (
        "partition_server/kafka/group_state.py",
        "            m.last_seen_ms = now_ms  # its session runs from its JoinGroup answer\n",
        "            pass  # TEETH: the session keeps running from the JoinGroup request\n",
    ),
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/server/kafka/test_group_state.py::"
    "test_a_session_runs_from_the_join_answer_not_from_the_join"
)
BUDGET = 1  # one pytest run
WHY_NOT_SIM = (
    "the simulation does not drive Kafka consumer groups; found by the raw-request "
    "integration test (a second member's join completed after the first's session "
    "timeout and it was expired at the next tick)"
)
