TITLE = (
    "a snapshot captured while a follower truncated takes the truncation count at the end, "
    "so rows from before the cut are trusted at recovery (a cut batch answered DUPLICATE)"
)
ORIGIN = "docs/reliability.md review finding 4 (2026-11-24)"
PATCHES = [
    (
        "partition_server/partition.py",
        "            rows,\n            truncations,\n",
        "            rows,\n            self.epochs.truncations,  # TEETH: read at the end\n",
    )
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/server/test_partition.py"
    "::test_rows_captured_before_a_cut_are_not_trusted_at_recovery"
)
BUDGET = 0
WHY_NOT_SIM = (
    "it needs a follower's cut inside a snapshot capture's yield, a crash of that follower "
    "before its next snapshot, a recovery from the bad one and that follower leading when a "
    "resend of a cut batch arrives: not seen in 16,000 seeds (docs/reliability.md)"
)
