TITLE = (
    "a failed in-sync-set write to ZooKeeper is never retried: a dead follower stays in the "
    "ISR and acks stall until leadership changes"
)
ORIGIN = "docs/reliability.md review finding 5 (2026-11-24)"
PATCHES = [
    (
        "partition_server/isr.py",
        "        self.pending_remove.clear()\n        self.retry_add |= self.pending_add\n",
        "        self.retry_add |= self.pending_add  # TEETH: a failed removal stays pending\n",
    )
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/server/test_replication.py::test_a_failed_removal_of_a_dead_follower_is_retried"
)
BUDGET = 0
WHY_NOT_SIM = (
    "it shows in the simulation only as a stuck producer, if the failed set_isr leaves a dead "
    "follower in the ISR until the run's 60 s deadline; leader changes end it first"
)
