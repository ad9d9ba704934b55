TITLE = (
    "a follower rejoined the in-sync set once it reached the leader's high watermark, which "
    "a new leader may not have learnt in full: a follower that started over, empty, at that "
    "high watermark rejoined below a batch the old leader acked, was elected, and the acked "
    "batch was lost"
)
ORIGIN = "docs/reliability.md sim finding 16 (seed 501223 --retention --no-zk3)"
PATCHES = [
    (
        "partition_server/isr.py",
        "and p.end_offset >= max(high_watermark, self.epoch_start)",
        "and p.end_offset >= high_watermark",
    )
]
SEARCH = "sim"
SIM_ARGS = ["--retention", "--no-zk3", "--start", "500000"]
PYTEST = ""
BUDGET = 3000
WHY_NOT_SIM = ""
# Also found by tests/unit/test_replication_partition.py::test_a_follower_rejoins_only_once_
# it_holds_the_new_leaders_log_at_its_epoch_start (`assert [2] == []`).
