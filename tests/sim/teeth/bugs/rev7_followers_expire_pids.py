TITLE = (
    "followers expire PIDs on their own clock (renewals touch only the leader's state): after "
    "a failover a live, idle, renewing producer gets UNKNOWN_PID"
)
ORIGIN = "docs/reliability.md review finding 7 (2026-11-24)"
PATCHES = [
    (
        "partition_server/log_manager.py",
        "            if part.role is not Role.LEADER:\n                continue\n"
        "            n = part.state.expire(",
        "            n = part.state.expire(  # TEETH: followers expire too\n",
    ),
    (
        "partition_server/partition.py",
        "self.state.drops_allowed = role is Role.LEADER",
        "self.state.drops_allowed = True  # TEETH: every replica drops state",
    ),
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/server/test_log_manager.py"
    "::test_follower_keeps_a_renewed_pid_and_the_new_leader_gives_it_a_full_period"
)
BUDGET = 0
WHY_NOT_SIM = (
    "one clock for all nodes, no coordinator renewals, and PID expiry at its production "
    "value: no PID expires in a run"
)
