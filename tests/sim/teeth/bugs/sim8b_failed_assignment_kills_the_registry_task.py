TITLE = (
    "a partition whose epochs cannot be saved (ENOSPC) raises out of the change handler and "
    "kills the task that applies ZooKeeper assignments: none is applied again"
)
ORIGIN = "docs/reliability.md sim finding 8 (the same failure's other half)"
PATCHES = [
    (
        "partition_server/replication.py",
        "except Exception as exc:  # noqa: BLE001 - e.g. the epoch file on a full disk",
        "except ZeroDivisionError as exc:  # TEETH: one partition's failure stops the rest",
    ),
    (
        "partition_server/registry.py",
        "                    except Exception:\n                        # Raising here",
        "                    except ZeroDivisionError:  # TEETH\n"
        "                        # Raising here",
    ),
]
SEARCH = "sim"
SIM_ARGS: list[str] = []
PYTEST = ""
BUDGET = 1500
WHY_NOT_SIM = ""
