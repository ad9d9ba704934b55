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
SEARCH = "sim"
SIM_ARGS: list[str] = []
PYTEST = ""
BUDGET = 1500
WHY_NOT_SIM = ""
