TITLE = (
    "a follower's log write fails (ENOSPC) after the fetched batches' epochs were saved: an "
    "epoch entry past its log end, so elected it can never take the role (stuck)"
)
ORIGIN = "docs/reliability.md sim finding 14 (seed 500722 --retention)"
PATCHES = [
    (
        "partition_server/replica_fetcher.py",
        "part.epochs.trim_past(part.log.next_offset)",
        "pass  # TEETH: the entry past the log end stays",
    )
]
SEARCH = "sim"
SIM_ARGS = ["--retention"]
PYTEST = ""
BUDGET = 4000
WHY_NOT_SIM = ""
