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
SEARCH = "sim"
SIM_ARGS: list[str] = []
PYTEST = ""
BUDGET = 1500
WHY_NOT_SIM = ""
