TITLE = (
    "monotonic topics without the refusal block and without the connection guard: batch N "
    "refused, N+1 appended, N's resend answered DUPLICATE (acked, never written)"
)
ORIGIN = "docs/reliability.md review findings 2 and 1b (2026-11-24)"
PATCHES = [
    (
        "partition_server/producer_state.py",
        "return  # (Kafka batches: their rules take only last+1, so no hole to guard)\n",
        "return  # (Kafka batches: their rules take only last+1, so no hole to guard)\n"
        "        return  # TEETH: no block\n",
    ),
    (
        "partition_server/refusal_guard.py",
        'the connection, which applies nothing more)."""\n',
        'the connection, which applies nothing more)."""\n'
        "        return  # TEETH: the guard never holds anything back\n",
    ),
]
SEARCH = "sim"
SIM_ARGS: list[str] = []
PYTEST = ""
BUDGET = 500
WHY_NOT_SIM = ""
