TITLE = (
    "a restart applied a snapshot taken before a topic was deleted to the directory of the "
    "topic created again under its name: a new producer's first batch was answered DUPLICATE "
    "(acked, never written)"
)
ORIGIN = "issue 25 item 3 (DeleteTopics)"
PATCHES = [
    (
        "partition_server/log_manager.py",
        "        if img is not None and loaded is not None and loaded[0].created_ms < born:\n",
        "        if False:  # TEETH: an older snapshot is trusted for a newer directory\n",
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
