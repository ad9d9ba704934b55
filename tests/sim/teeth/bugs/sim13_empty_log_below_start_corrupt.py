TITLE = (
    "a log cut back to its own start (empty, log start above 0) raises CorruptRecord in "
    "iter_headers, cut_point and truncate_to: a server that cannot restart"
)
ORIGIN = "docs/reliability.md sim finding 13 (seed 172 --retention)"
PATCHES = [
    (
        "partition_server/log.py",
        "        if max(offset, self.log_start_offset) >= self.next_offset:\n"
        "            return self.next_offset  # nothing at or above it",
        "        if offset >= self.next_offset:  # TEETH\n"
        "            return self.next_offset  # nothing at or above it",
    ),
    (
        "partition_server/log.py",
        '(nothing changes)."""\n'
        "        if max(offset, self.log_start_offset) >= self.next_offset:\n",
        '(nothing changes)."""\n        if offset >= self.next_offset:  # TEETH\n',
    ),
    (
        "partition_server/log.py",
        "if max(from_offset, self.log_start_offset) >= self.next_offset:",
        "if from_offset >= self.next_offset:  # TEETH",
    ),
]
SEARCH = "sim"
SIM_ARGS = ["--retention"]
PYTEST = ""
BUDGET = 2000
WHY_NOT_SIM = ""
