TITLE = (
    "a server down while a topic was deleted and created again served its old directory as "
    "the new topic's partition: old records and old producer state in a new topic"
)
ORIGIN = "issue 25 item 3 (DeleteTopics)"
PATCHES = [
    (
        "partition_server/log_manager.py",
        "            elif have != spec.created_ms:\n",
        "            elif False:  # TEETH: the incarnation marker is not compared\n",
    ),
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/server/test_log_manager.py::"
    "test_a_directory_of_an_older_life_is_dropped_and_old_snapshots_are_not_applied"
)
BUDGET = 1  # one pytest run
WHY_NOT_SIM = "the simulation has no topic deletion or re-creation (no admin operations)"
