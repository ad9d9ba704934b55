TITLE = (
    "a consumer group accepted an OffsetCommit from a member of an older generation (a "
    "zombie whose partitions were reassigned could overwrite the new owner's offsets)"
)
ORIGIN = "issue 25 item 1"
PATCHES = [
    (
        "partition_server/kafka/group_state.py",
        "        if generation != self.generation:\n"
        "            return ILLEGAL_GENERATION\n"
        "        if self.state is State.COMPLETING_REBALANCE:\n",
        "        if self.state is State.COMPLETING_REBALANCE:  # TEETH: no generation check\n",
    ),
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = "tests/unit/server/kafka/test_group_state.py::test_generations_and_zombies"
BUDGET = 1  # one pytest run
WHY_NOT_SIM = (
    "the simulation drives producers and partitions, not Kafka consumer groups: the group "
    "rules are a pure module checked by their own property test (a model of what each "
    "client knows) and by tests/integration/test_kafka_groups.py"
)
