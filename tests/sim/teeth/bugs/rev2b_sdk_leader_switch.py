TITLE = (
    "the SDK sends a partition's next batch to a new leader while earlier ones are "
    "unanswered on the old leader's connection (monotonic: the resend answered DUPLICATE)"
)
ORIGIN = "docs/reliability.md review finding 2b (2026-11-24)"
PATCHES = [
    (
        "pidlease/client/sender.py",
        "if self.in_flight and conn is not self._conn:",
        "if False and self.in_flight and conn is not self._conn:  # TEETH",
    )
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/client/test_sender.py"
    "::test_no_batch_goes_to_a_new_leader_while_an_earlier_one_is_unanswered"
)
BUDGET = 0
WHY_NOT_SIM = "the simulation's producer is a model of sender.py, not sender.py itself"
