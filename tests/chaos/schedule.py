"""The chaos suite's fault schedule: a pure function of a seed, so a failing seed replays
the same faults at the same moments (the interleaving with the producers' threads is the
operating system's, so a replay is the same experiment, not the same instruction trace).

A schedule is a list of ``Fault``s, each at a moment in seconds from the start, with a
target index and a duration. Faults never overlap (each waits for the previous one to be
healed), and the last one ends before ``duration_s`` so every run finishes healed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# kind -> (weight, min seconds, max seconds); durations are how long the fault lasts.
FAULT_KINDS: dict[str, tuple[int, float, float]] = {
    "kill_server": (3, 0.0, 1.0),  # SIGKILL, down for the duration, restart
    "kill_server_torn": (2, 0.0, 0.5),  # SIGKILL, tear the newest segment's tail, restart
    "pause_server": (3, 0.3, 2.0),  # SIGSTOP .. SIGCONT
    "expire_server_session": (1, 0.0, 0.0),  # SIGSTOP past its ZooKeeper session timeout
    "kill_coordinator": (2, 0.0, 1.0),
    "pause_coordinator": (2, 0.3, 2.0),
    "drop_connections": (3, 0.0, 0.0),  # every producer socket aborted at once
    "blackhole_coordinator": (2, 0.5, 3.0),  # the loopback proxy forwards nothing
    "delay_coordinator": (1, 1.0, 3.0),  # the proxy holds every chunk 200 ms
    "cut_server": (2, 0.0, 0.0),  # the server's proxy aborts every connection
    "blackhole_server": (2, 0.5, 3.0),  # the server's proxy forwards nothing
    "delay_server": (1, 1.0, 3.0),  # the server's proxy holds every chunk 200 ms
    "zombie_takeover": (2, 0.0, 0.0),  # take a producer's name over; the old one must be refused
    "kill_zk_node": (2, 1.0, 4.0),  # only with a 3-node ensemble
}


@dataclass(frozen=True)
class Fault:
    at_s: float
    kind: str
    target: int  # server / coordinator / producer / ZooKeeper node index
    duration_s: float

    def describe(self) -> str:
        return f"t={self.at_s:5.1f}s {self.kind}[{self.target}] for {self.duration_s:.1f}s"


def make_schedule(
    seed: int,
    duration_s: float,
    *,
    servers: int,
    coordinators: int,
    producers: int,
    zk_nodes: int,
    session_expiry_s: float,
    gap_s: tuple[float, float] = (0.5, 2.5),
    faults_max: int = 1000,
    required: tuple[str, ...] = (),
) -> list[Fault]:
    """Faults for one run. ``session_expiry_s`` is how long a server must be frozen for
    ZooKeeper to expire its session (its session timeout plus a margin). The ``required``
    kinds come first, once each (so a short run is sure to contain them), then random ones."""
    rng = random.Random(seed)
    kinds = [k for k in FAULT_KINDS if k != "kill_zk_node" or zk_nodes >= 3]
    weights = [FAULT_KINDS[k][0] for k in kinds]
    targets = {
        "server": servers,
        "coordinator": coordinators,
        "producer": producers,
        "zk": zk_nodes,
    }
    out: list[Fault] = []
    t = rng.uniform(*gap_s)
    forced = [k for k in required if k in kinds]
    while len(out) < faults_max:
        kind = forced.pop(0) if forced else rng.choices(kinds, weights)[0]
        _, lo, hi = FAULT_KINDS[kind]
        dur = session_expiry_s if kind == "expire_server_session" else rng.uniform(lo, hi)
        if t + dur + 1.0 > duration_s:
            break
        group = (
            "zk"
            if kind == "kill_zk_node"
            else "producer"
            if kind == "zombie_takeover"
            else "coordinator"
            if "coordinator" in kind
            else "producer"
            if kind == "drop_connections"
            else "server"
        )
        out.append(Fault(round(t, 2), kind, rng.randrange(max(1, targets[group])), round(dur, 2)))
        t += dur + rng.uniform(*gap_s)
    return out
