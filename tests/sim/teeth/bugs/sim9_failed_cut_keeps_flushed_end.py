TITLE = (
    "a failed fsync or ftruncate inside a follower's cut is taken for a session error: "
    "flushed_end stays above the cut and later fetched batches count as fsynced"
)
ORIGIN = "docs/reliability.md sim finding 9 (seeds 1426, 1817)"
PATCHES = [
    (
        "partition_server/partition.py",
        "        self.flushed_end = min(self.flushed_end, end)\n"
        "        self.high_watermark = min(self.high_watermark, end)\n",
        "",
    ),
    (
        "partition_server/partition.py",
        "            self.flusher.fatal(exc)\n"
        "            raise\n"
        "        self.epochs.truncate_to(end)\n",
        "            raise  # TEETH: no crash, the ends lowered only after a successful cut\n"
        "        self.flushed_end = min(self.flushed_end, end)\n"
        "        self.high_watermark = min(self.high_watermark, end)\n"
        "        self.epochs.truncate_to(end)\n",
    ),
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/server/test_partition.py"
    "::test_a_failed_cut_calls_the_fsync_error_policy_and_lowers_the_flushed_end"
)
BUDGET = 0
WHY_NOT_SIM = (
    "not found by the simulation in seeds 0-1,499 (2026-11-27, 1,062 s) nor in seeds "
    "1,500-1,765 and 2,250-2,507; seeds 1426 and 1817 showed it on an older "
    "world. It needs a failed fsync or ftruncate inside a follower's cut, then batches "
    "fetched and counted durable before anything else fails"
)
