TITLE = (
    'a Kafka admin request naming the topic "keep/partitions/0" reached the ZooKeeper path of '
    "topic keep's partition 0 (DeleteTopics could remove it)"
)
ORIGIN = "issue 25 item 3 (fuzzed admin requests)"
PATCHES = [
    (
        "partition_server/kafka/topics.py",
        "    if topic_name_problem(name):\n"
        '        raise CreateError(UNKNOWN_TOPIC_OR_PARTITION, f"no topic',
        "    if False:  # TEETH: any string is a topic name\n"
        '        raise CreateError(UNKNOWN_TOPIC_OR_PARTITION, f"no topic',
    ),
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = "tests/fuzz/test_fuzz_kafka_admin.py::test_names_that_are_paths_name_no_topic"
BUDGET = 1  # one pytest run
WHY_NOT_SIM = "the simulation sends no Kafka admin requests"
