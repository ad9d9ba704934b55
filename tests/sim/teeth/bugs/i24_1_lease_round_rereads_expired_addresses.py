TITLE = (
    "a renewal round reads the leader address cache again after looking up the others: an "
    "entry that expired meanwhile is asked of nobody and the whole lease request fails "
    "(KeyError, HTTP 500)"
)
ORIGIN = "issue 24 item 1 (found by bench/bench_partitions.py at P=3000)"
PATCHES = [
    (
        "coordinator/service.py",
        "                address = known.get(tp)\n",
        "                address = self.addresses.get(tp)\n",
    )
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/coordinator/test_service.py::"
    "test_leader_addresses_that_expire_during_the_lookup_of_others_are_still_asked"
)
BUDGET = 1
WHY_NOT_SIM = "the simulation has no coordinator: its producers talk to the partition servers"
