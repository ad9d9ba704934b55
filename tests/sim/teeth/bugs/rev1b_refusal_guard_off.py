TITLE = (
    "no connection refusal guard: after a retriable refusal of a producer's batch, its later "
    "batches on the same connection are applied (defence in depth behind finding 1)"
)
ORIGIN = "docs/reliability.md review finding 1b (2026-11-24)"
PATCHES = [
    (
        "partition_server/refusal_guard.py",
        'the connection, which applies nothing more)."""\n',
        'the connection, which applies nothing more)."""\n'
        "        return  # TEETH: the guard never holds anything back\n",
    )
]
SEARCH = "sim"
SIM_ARGS: list[str] = []
PYTEST = ""
BUDGET = 3000
WHY_NOT_SIM = ""
