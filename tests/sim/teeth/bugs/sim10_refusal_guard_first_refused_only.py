TITLE = (
    "the refusal guard lets a later batch through once the partition holds the first refused "
    "one: after a failover to a leader with part of the run, a hole (OUT_OF_ORDER_SEQUENCE)"
)
ORIGIN = "docs/reliability.md sim finding 10 (seed 3030)"
PATCHES = [
    (
        "partition_server/refusal_guard.py",
        "self.ranges[0], self.ranges[-1], self.code)",
        "self.ranges[0], self.ranges[1], self.code)  # TEETH: the first refused range only",
    )
]
SEARCH = "sim"
SIM_ARGS: list[str] = []
PYTEST = ""
BUDGET = 4000
WHY_NOT_SIM = ""
