TITLE = (
    "ENOSPC while a new leader saves leader-epochs leaves the epoch entry in memory unsaved: "
    "the retry saves nothing and replicas can diverge after a restart"
)
ORIGIN = "docs/reliability.md sim finding 8"
PATCHES = [
    (
        "partition_server/epochs.py",
        "            self.entries, self.truncations = entries, truncations\n            raise\n",
        "            raise  # TEETH: memory keeps what the file lacks\n",
    )
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/server/test_partition.py"
    "::test_a_failed_save_in_become_leader_changes_nothing_and_the_retry_saves"
)
BUDGET = 0
WHY_NOT_SIM = (
    "not found by the simulation in 1,500 seeds (2026-11-27): it needs ENOSPC at the moment a "
    "new leader saves its epochs, then a restart of that replica before any later save, and "
    "a divergence the checker then sees; the finding was first seen together with its other "
    "half (sim8b, which the simulation finds)"
)
