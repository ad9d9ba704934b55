TITLE = (
    "send_batch(timestamp_ms=) ignored: a mirror's target records get the mirror's clock, "
    "not the source's timestamps"
)
ORIGIN = "issue 26 item 2"
PATCHES = [
    (
        "pidlease/client/sender.py",
        "timestamp_ms=int(self.ctx.wall_ms()) if stamp is None else stamp,",
        "timestamp_ms=int(self.ctx.wall_ms()),",
    )
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = "tests/unit/client/test_send_batch.py::test_explicit_timestamp_is_every_batch_s_timestamp"
BUDGET = 1  # one pytest run
WHY_NOT_SIM = "the simulation drives the partition server, not the SDK's batch building"
