TITLE = (
    "a takeover restarts a partition at sequence 0 when the PID wrote there, was never marked "
    "seen, and the server expired it"
)
ORIGIN = "docs/reliability.md review finding 6 (2026-11-24)"
PATCHES = [
    (
        "partition_server/producer_state.py",
        "return leased_since_ms <= 0 or self.dropped_last_use_max_ms < leased_since_ms",
        "return True  # TEETH: a FENCE creates an entry whatever was dropped",
    )
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/server/test_partition.py"
    "::test_fence_creates_an_entry_only_for_a_pid_leased_after_the_horizon"
)
BUDGET = 0
WHY_NOT_SIM = (
    "the simulation has no coordinator and keeps PID expiry at its production value (hours): "
    "no PID is ever expired in a run"
)
