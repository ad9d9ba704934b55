TITLE = (
    "a streaming read task returned every record up to the high watermark instead of its "
    "micro-batch's planned end: a replay after a restart reads other records than the "
    "killed run did"
)
ORIGIN = "issue 26 item 3"
PATCHES = [
    (
        "pidlease/spark/stream_source.py",
        "                    if rec.offset >= rng.end:\n",
        "                    if False:  # TEETH: no end to the range\n",
    ),
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/integration/test_spark_stream_source.py::"
    "test_a_range_reads_exactly_its_offsets_however_the_log_grows"
)
BUDGET = 1  # one pytest run
WHY_NOT_SIM = "the simulation runs no Spark data source; the read task is tested on a real cluster"
