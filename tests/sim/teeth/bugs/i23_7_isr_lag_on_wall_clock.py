TITLE = "the in-sync set's lag check read the wall clock: an NTP step shrank every in-sync set"
ORIGIN = "issue 23 item 7"
# Not an exactly-once hole (the high watermark keeps acks safe) but an outage: a wall-clock
# step forward made every follower look replica_lag_time_max_ms behind at once.
PATCHES = [
    (
        "partition_server/replication.py",
        "        return int(self.mono_ms())",
        "        return self.clock_ms()",
    )
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = "tests/unit/server/test_replication.py::test_a_wall_clock_step_shrinks_no_in_sync_set"
BUDGET = 0
WHY_NOT_SIM = (
    "the simulation's wall clock and monotonic clock are the same virtual clock: it never "
    "steps one without the other"
)
