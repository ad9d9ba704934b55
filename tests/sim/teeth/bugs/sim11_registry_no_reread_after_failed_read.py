TITLE = (
    "after a failed ZooKeeper read nothing reads it again: a topic created meanwhile stays "
    "unknown to a server that gets no request for it"
)
ORIGIN = "docs/reliability.md sim finding 11 (seeds 1510, 3415)"
PATCHES = [
    (
        "partition_server/registry.py",
        "self._retry = loop.call_later(READ_RETRY_S, self._read_again)",
        "pass  # TEETH: never read again",
    )
]
SEARCH = "sim"
SIM_ARGS: list[str] = []
PYTEST = ""
BUDGET = 4000
WHY_NOT_SIM = ""
