TITLE = (
    "a send_batch call's batches are queued ahead of the partition's open batch: records "
    "sent before the call go after it (explicit ids: OUT_OF_ORDER, the producer fails)"
)
ORIGIN = "issue 28 item 1 (the accumulator's ordering rule)"
PATCHES = [
    (
        "pidlease/client/accumulator.py",
        "            self._close(partition, batch, wake=False)  # one wake-up below for both",
        "            pass  # TEETH: the open batch stays open, behind the call's batches",
    )
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/client/test_send_batch.py"
    "::test_interleaved_sends_keep_call_order_in_each_partition[fast]"
)
BUDGET = 0
WHY_NOT_SIM = "the simulation's producer is a model of sender.py, not the SDK's accumulator"
