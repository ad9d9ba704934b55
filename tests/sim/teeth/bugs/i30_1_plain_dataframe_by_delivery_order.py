TITLE = (
    "a plain (un-bucketed) DataFrame's Spark partition numbered its rows in delivery order: "
    "a retry that saw them in another order lost rows and doubled others"
)
ORIGIN = "issue 30 item 1 (plain DataFrame, same split)"
# The plain path keeps the delivery order within each topic partition instead of the
# order of the rows' content (key, then value bytes).
PATCHES = [
    (
        "pidlease/spark/columnar.py",
        "                order = content_order_columns(parts, cols.keys, cols.values)",
        '                order = np.argsort(parts, kind="stable")',
    )
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/spark/test_columnar.py::test_a_plain_retry_in_another_order_writes_every_row_once"
)
BUDGET = 0
WHY_NOT_SIM = (
    "the simulation models the partition server and the coordinator, not Spark: the row "
    "order a retried task delivers is outside it"
)
