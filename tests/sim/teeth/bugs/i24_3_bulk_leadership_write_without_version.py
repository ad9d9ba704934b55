TITLE = (
    "bulk leadership writes (elections, step-ins, in-sync changes in one ZooKeeper multi) "
    "ignore the version they were read at: a survivor overwrites the state another just won"
)
ORIGIN = "issue 24 item 3"
PATCHES = [
    (
        "partition_server/leadership.py",
        "t.set_data(partition_path(c.topic, c.partition), new.to_bytes(), version=version)",
        "t.set_data(partition_path(c.topic, c.partition), new.to_bytes(), version=-1)",
    )
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/server/test_leadership.py::"
    "test_a_transaction_that_meets_a_moved_znode_writes_nothing_and_the_lost_one_drops_out"
)
BUDGET = 1
WHY_NOT_SIM = (
    "not found in about 250 seeds: it needs two servers' read and commit on the same znode "
    "to interleave, and an election overwritten that way is still contained by the high "
    "watermark (the overwritten winner's followers follow the last writer, so it acks "
    "nothing); the unit test moves the znode between the read and the commit"
)
