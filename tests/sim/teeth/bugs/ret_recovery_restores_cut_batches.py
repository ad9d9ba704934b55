TITLE = (
    "recovery from a distrusted snapshot restores a deleted PID's row whole, batches cut "
    "since included: their resend is answered DUPLICATE, never written"
)
ORIGIN = "docs/log.md retention gap 1, the filter below the log start (commit 2e5900a)"
PATCHES = [
    (
        "partition_server/partition.py",
        "            if flat[i + 2] < start:\n",
        "            if True:  # TEETH: cut batches kept\n",
    )
]
SEARCH = "sim"
SIM_ARGS = ["--retention"]
PYTEST = ""
BUDGET = 4000
WHY_NOT_SIM = ""
