TITLE = (
    "an SDK sender waiting for answers after its backoff ran out spins without sleeping "
    "(tens of thousands of turns a second)"
)
ORIGIN = "docs/reliability.md review finding 2c (2026-11-24)"
PATCHES = [
    (
        "pidlease/client/sender.py",
        "await self._wait(self._delivery_deadline_s(now))",
        "await self._wait(self._deadline_s(now))  # TEETH",
    )
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = "tests/unit/client/test_sender.py::test_waiting_for_answers_before_a_resend_does_not_spin"
BUDGET = 0
WHY_NOT_SIM = (
    "the simulation's producer is a model of sender.py, not sender.py itself; and a spin "
    "costs CPU, not virtual time"
)
