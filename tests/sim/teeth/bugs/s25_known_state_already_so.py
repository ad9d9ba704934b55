TITLE = (
    "a bulk in-sync change planned against the registry's last read answered 'already so' "
    "from that read, while this server's own later write had put a removed follower back: "
    "the leader counted a smaller in-sync set than ZooKeeper named"
)
ORIGIN = "issue 24 (session 25: elections against known versions)"
# The rule: only a write is planned from a known (state, version); answers without one
# come from a fresh read. The patch takes "already so" from the known state.
PATCHES = [
    (
        "partition_server/leadership.py",
        "        if got is None or plan is None or plan[0] is got[0]:\n"
        "            unknown.append(c)\n",
        "        if got is not None and plan is not None and plan[0] is got[0]:  # TEETH\n"
        "            result[c.key] = got[0]\n"
        "        elif got is None or plan is None:\n"
        "            unknown.append(c)\n",
    ),
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/server/test_leadership.py::test_already_so_is_never_answered_from_a_known_state"
)
BUDGET = 1  # one pytest run
WHY_NOT_SIM = (
    "the simulation ran 400 seeds (90 s) with the patch without a failure: it needs a "
    "leader's own in-sync expansion to land after its registry's read and a shrink back to "
    "the old set asked before the data watch's re-read, within one bulk flush; the unit "
    "test builds that order, and the property test over known states finds it too"
)
