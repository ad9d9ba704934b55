TITLE = (
    "offset retention expired a group while one of its commits was being written: the "
    "group tombstone landed after the commit and took the acknowledged offset with it (a "
    "group created by its first commit went at once)"
)
ORIGIN = "issue 25 item 3 (session 23, groups2)"
PATCHES = [
    (
        "partition_server/kafka/group_state.py",
        "        if self.state is State.DEAD or self.pending or self.writes_in_flight:\n",
        "        if self.state is State.DEAD or self.pending:  # TEETH: in flight ignored\n",
    ),
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/server/kafka/test_group_state.py::"
    "test_nothing_expires_while_a_commit_is_being_written"
)
BUDGET = 1  # one pytest run
WHY_NOT_SIM = (
    "the simulation drives producers and partitions, not Kafka consumer groups: the group "
    "rules are a pure module checked by their own tests, and the race by "
    "tests/integration/test_dashboard_groups.py on real servers"
)
