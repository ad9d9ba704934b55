TITLE = (
    "the pipeline numbered rows in delivery order: a replay in another order lost rows "
    "and doubled others"
)
ORIGIN = "issue 30 item 1"
# Rows keep their delivery order within a (bucket, topic partition) group instead of
# being put in the order of their content (row hash, then bytes).
PATCHES = [
    (
        "pidlease/spark/sequencing.py",
        "    order = np.argsort(hashes)\n",
        "    order = np.arange(len(hashes))\n",
    )
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/spark/test_columnar.py"
    "::test_a_micro_batch_replayed_in_another_order_writes_every_row_once"
)
BUDGET = 0
WHY_NOT_SIM = (
    "the simulation models the partition server and the coordinator, not Spark: the row "
    "order a replayed micro-batch or a retried task delivers is outside it"
)
