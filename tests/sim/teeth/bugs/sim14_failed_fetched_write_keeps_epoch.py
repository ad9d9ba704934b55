TITLE = (
    "a follower's log write fails (ENOSPC) after the fetched batches' epochs were saved: an "
    "epoch entry past its log end, so elected it can never take the role (stuck)"
)
ORIGIN = "docs/reliability.md sim finding 14 (seed 500722 --retention)"
PATCHES = [
    (
        "partition_server/partition.py",
        "self.epochs.trim_past(self.log.next_offset)",
        "pass  # TEETH: the entry past the log end stays",
    )
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/server/test_partition.py"
    "::test_a_failed_log_write_after_the_epochs_were_saved_leaves_no_entry_past_the_end"
)
BUDGET = 0
WHY_NOT_SIM = (
    "not yet measured with the simulation: the run (--retention, seed 500722 found it "
    "on an older world) did not get to it on 2026-11-27 on the shared machine (~100 "
    "seeds/min); measure with SEARCH 'sim', SIM_ARGS ['--retention'] and a budget "
    "of a few thousand"
)
