TITLE = "the coordinator answered a sequence at or below the highwater it recorded for a partition"
ORIGIN = "issue 23 Build 3 (finding 2)"
# A partition that rebuilt a PID from a fence alone (retention, then a cut) reported
# highwater -1; the lease answered sequence 0 although the coordinator had recorded a
# higher durable highwater for that partition, and a replayable source wrote its records
# again. The property test tests/unit/coordinator/test_leases.py::TestRecordedHighwater catches
# it too.
PATCHES = [
    (
        "coordinator/leases.py",
        "        if durable_highwater < recorded_highwater:",
        "        if durable_highwater < recorded_highwater - 2**62:",
    )
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = (
    "tests/unit/coordinator/test_service.py::"
    "test_renewal_below_the_recorded_highwater_is_unknown_pid"
)
BUDGET = 0
WHY_NOT_SIM = "the simulation does not run the coordinator"
