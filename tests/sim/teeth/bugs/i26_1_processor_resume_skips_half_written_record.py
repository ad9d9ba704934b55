TITLE = (
    "processor resume: a record with some outputs written but no end mark counted as done "
    "(its other outputs lost)"
)
ORIGIN = "issue 26 item 1"
# Patches that bring the bug back, applied in order to a scratch copy of the repo.
PATCHES = [
    (
        "pidlease/client/processor.py",
        "        return ResumePlan(offset + 1)\n    return ResumePlan(offset, index)\n",
        "        return ResumePlan(offset + 1)\n    return ResumePlan(offset + 1)\n",
    )
]
SEARCH = "pytest"
SIM_ARGS: list[str] = []
PYTEST = "tests/unit/client/test_processor.py::test_any_crash_point_gives_each_output_exactly_once"
BUDGET = 1  # one pytest run
WHY_NOT_SIM = (
    "the simulation runs the partition server; the processor's resume rule lives in the SDK "
    "(pidlease/client/processor.py) and is checked by its property test against the contract"
)
