TITLE = (
    "a replica move handed leadership to a new replica before it was in sync, and the "
    "server took a leadership ZooKeeper gave it while out of the in-sync set: acked "
    "records were lost"
)
ORIGIN = "issue 27 item 1 (replica moves)"
# Both defences must go for the bug to come back: the move's wait for the new replicas to
# be in sync (coordinator/moves.py next_step), and the replica manager's refusal to lead
# an epoch whose in-sync set lacks it (it steps in instead: leadership.step_in).
PATCHES = [
    (
        "coordinator/moves.py",
        '    if behind:\n        return Step("wait", f"{behind} catching up")\n',
        "    if False:  # TEETH: no wait for the new replicas\n        pass\n",
    ),
    (
        "partition_server/replication.py",
        "if self.inherited.get(key) == ps.leader_epoch or me not in ps.isr:",
        "if self.inherited.get(key) == ps.leader_epoch:  # TEETH: leads out of sync",
    ),
]
SEARCH = "sim"
# Moves run in 35% of the seeds with three servers (tests/sim/elastic.py, its own random
# stream); found at seed 105 (106 seeds) with no arguments, and at seed 10 with the
# environment variable PIDLEASE_SIM_ELASTIC set to one (every such seed).
SIM_ARGS: list[str] = []
PYTEST = ""
BUDGET = 1500
WHY_NOT_SIM = ""
