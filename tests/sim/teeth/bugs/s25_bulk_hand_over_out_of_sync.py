TITLE = (
    "a bulk handover (controlled shutdown, preferred leader) chose its successor among all "
    "replicas, not the in-sync ones, and the server took the leadership while out of the "
    "in-sync set: acked records were lost"
)
ORIGIN = "issue 24 (handovers in bulk transactions, session 25)"
# Both defences must go: the bulk rule's successor among the in-sync set (leadership.py,
# the hand_over branch of _plan), and the replica manager's refusal to lead an epoch
# whose in-sync set lacks it (as in i27_3).
PATCHES = [
    (
        "partition_server/leadership.py",
        "        return plan_hand_over(\n            ps, me,",
        "        ps = PartitionState(ps.replicas, ps.leader, ps.leader_epoch, ps.replicas)"
        "  # TEETH\n"
        "        return plan_hand_over(\n            ps, me,",
    ),
    (
        "partition_server/replication.py",
        "if self.inherited.get(key) == ps.leader_epoch or me not in ps.isr:",
        "if self.inherited.get(key) == ps.leader_epoch:  # TEETH: leads out of sync",
    ),
]
SEARCH = "sim"
# Found at seed 1260 (1261 seeds, 14 min at load 15) with no arguments: SIGTERM handovers
# run in the elastic seeds only (35 % of the three-server ones).
SIM_ARGS: list[str] = []
PYTEST = ""
BUDGET = 2000
WHY_NOT_SIM = ""
