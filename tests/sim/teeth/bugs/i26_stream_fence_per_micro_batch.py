TITLE = (
    "a streaming sink took every bucket's producer over in every micro-batch: a fence "
    "record per bucket and partition per micro-batch, inflating the topic's offsets"
)
ORIGIN = "issue 26 (the Spark streaming sink, one fence per micro-batch per partition)"
# The first attempt of a micro-batch no longer renews its producers: every task
# takes its producers over again.
PATCHES = [
    (
        "pidlease/spark/attempt.py",
        "        return t.batch_id is not None and t.attempt == 0 and not t.speculative\n",
        "        return False\n",
    )
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/spark/test_columnar.py"
    "::test_micro_batches_renew_their_producers_and_write_no_fence_record"
)
BUDGET = 0
WHY_NOT_SIM = (
    "the simulation models the partition server and the coordinator, not Spark: which "
    "task of which micro-batch leases a producer is outside it"
)
