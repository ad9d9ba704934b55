TITLE = (
    "a log cut back to its own start (empty, log start above 0) raises CorruptRecord when its "
    "headers are read: a server that cannot restart"
)
ORIGIN = "docs/reliability.md sim finding 13 (seed 172 --retention)"
PATCHES = [
    (
        "partition_server/log.py",
        "if max(from_offset, self.log_start_offset) >= self.next_offset:",
        "if from_offset >= self.next_offset:  # TEETH",
    )
]
SEARCH = "sim"
SIM_ARGS = ["--retention"]
PYTEST = ""
BUDGET = 3000
WHY_NOT_SIM = ""
