TITLE = (
    "a checkpoint of the group log kept the offsets of a group deleted before it (the table "
    "dropped only the group record on a group tombstone): once the log was cut below the "
    "checkpoint, a new coordinator brought a deleted group's offsets back"
)
ORIGIN = "issue 25, session 24 item 1 (compaction of the group log)"
PATCHES = [
    (
        "partition_server/kafka/group_log.py",
        "                self.groups.pop(op.group_id, None)\n",
        "                self.groups.setdefault(op.group_id, _Entry()).record = None  # TEETH\n",
    )
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/server/kafka/test_group_log.py::"
    "test_a_group_tombstone_takes_its_offsets_and_stays_after_the_cut"
)
BUDGET = 1  # one pytest run
WHY_NOT_SIM = (
    "the simulation sends no group requests (docs/kafka.md, 'Consumer groups'): the group "
    "log's records and checkpoints are not in its model"
)
