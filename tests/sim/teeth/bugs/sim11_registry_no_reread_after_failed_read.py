TITLE = (
    "after a failed ZooKeeper read nothing reads it again: a topic created meanwhile stays "
    "unknown to a server that gets no request for it"
)
ORIGIN = "docs/reliability.md sim finding 11 (seeds 1510, 3415)"
PATCHES = [
    (
        "partition_server/registry.py",
        "self._retry = loop.call_later(READ_RETRY_S, self._read_again)",
        "pass  # TEETH: never read again",
    )
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/server/test_registry.py"
    "::test_a_failed_read_is_read_again_and_learns_what_was_created_meanwhile"
)
BUDGET = 0
WHY_NOT_SIM = (
    "not found by the simulation in 4,000 seeds (2026-11-27). Likely why (not verified): a "
    "server that missed a topic reads ZooKeeper again at its first request for it (the read "
    "loop, finding 1's fix), so only a follower that gets no request stays blind, which the "
    "checks see only if acks then stall to the run's end; seeds 1510 and 3415 showed it "
    "together with the harness's wall-clock memo, since fixed"
)
