TITLE = (
    "a flush that completes after a follower cut its log marks the regrown log durable: "
    "batches fetched later are reported fsynced to the leader"
)
ORIGIN = "docs/reliability.md review finding 3 (2026-11-24)"
PATCHES = [
    (
        "partition_server/partition.py",
        "        if generation != self.epochs.truncations:\n",
        "        if False:  # TEETH: a flush from before a cut counts\n",
    )
]
SEARCH = "sim"
SIM_ARGS: list[str] = []
PYTEST = ""
BUDGET = 3000
WHY_NOT_SIM = ""
