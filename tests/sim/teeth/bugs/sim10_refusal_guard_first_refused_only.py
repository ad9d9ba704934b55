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
SEARCH = "sim"
SIM_ARGS: list[str] = []
PYTEST = ""
BUDGET = 4000
WHY_NOT_SIM = ""
