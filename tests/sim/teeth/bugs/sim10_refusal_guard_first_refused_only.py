TITLE = (
    "the refusal guard lets a later batch through once the partition holds the first refused "
    "one: after a failover to a leader with part of the run, a hole (OUT_OF_ORDER_SEQUENCE); "
    "today: note() keeps a generation's first refused range, never adds the batches held back"
)
ORIGIN = "docs/reliability.md sim finding 10 (seed 3030)"
PATCHES = [
    (
        "partition_server/refusal_guard.py",
        "        ranges = h.ranges\n        if base_sequence < ranges[0]:\n",
        "        return  # TEETH: the held range never grows past the first refusal\n"
        "        ranges = h.ranges\n        if base_sequence < ranges[0]:\n",
    )
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/server/test_refusal_guard.py::"
    "test_the_refused_range_grows_with_every_batch_held_back"
)
BUDGET = 0
WHY_NOT_SIM = (
    "the simulation missed it in 4,000 seeds on 2026-11-27 (1,114 s; it took 1,286 on the "
    "code of the fix): the partition's monotonic refusal block now remembers every refused "
    "range (producer_state.py), a defence behind the guard the sim cannot get past"
)
