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
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/server/test_log.py::test_a_log_cut_back_to_its_start_is_empty_and_still_answers"
)
BUDGET = 0
WHY_NOT_SIM = (
    "not found by the simulation (--retention) in 2,000 seeds (2026-11-27, 1,412 s): "
    "it needs a follower cut back to exactly its log start and then a restart or a "
    "rebuild of that empty log; seed 172 showed it on an older world"
)
