TITLE = (
    "monotonic topics: a refused batch does not block the PID's later ones, so its resend "
    "below the new highwater is not appended (acked, not in the log)"
)
ORIGIN = "docs/reliability.md review finding 2 (2026-11-24)"
PATCHES = [
    (
        "partition_server/producer_state.py",
        "return  # (Kafka batches: their rules take only last+1, so no hole to guard)\n",
        "return  # (Kafka batches: their rules take only last+1, so no hole to guard)\n"
        "        return  # TEETH: no block\n",
    )
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/server/test_producer_state.py"
    "::test_monotonic_refusal_blocks_later_batches_until_the_resend"
)
BUDGET = 0
WHY_NOT_SIM = (
    "the connection refusal guard alone holds the later batches back in every refusal the "
    "simulation makes (ENOSPC on append is answered on the producer's own connection); "
    "see rev2_and_1b for the two together, which the simulation finds"
)
