"""CPU seconds and peak resident memory of server processes, read from /proc.

Why /proc and not psutil: it is all we need (two numbers per process), and Linux lets us
reset a process's peak RSS (``clear_refs`` with 5), so a peak can be measured per phase of
one long-lived server instead of since its start.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """CPU time of ``pid`` so far, all its threads. From each thread's ``schedstat``
    (nanoseconds) when the kernel has it: ``stat`` counts in ticks of 10 ms, too coarse
    for a pass that costs the server a fraction of a second."""
    try:
        total = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        return total / 1e9
    except (OSError, ValueError, IndexError):
        pass
    with open(f"/proc/{pid}/stat") as f:
        # The command name may hold spaces; fields count from after its closing paren.
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _status_kb(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    return 0


def peak_rss_bytes(pid: int) -> int:
    return _status_kb(pid, "VmHWM:") * 1024


def reset_peak(pid: int) -> bool:
    """Start a new peak-RSS period (Linux >= 4.0). False when not allowed."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@dataclass
class ProcUsage:
    cpu_s: float
    peak_rss_bytes: int


class ProcWatch:
    """CPU used and peak RSS reached by a set of processes between ``start`` and ``stop``
    (peak RSS summed over the processes: they hold memory at the same time)."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = list(pids)
        self._cpu0: dict[int, float] = {}
        self.peak_reset = True

    def start(self) -> None:
        for pid in self.pids:
            self._cpu0[pid] = cpu_seconds(pid)
            self.peak_reset &= reset_peak(pid)

    def stop(self) -> ProcUsage:
        cpu = sum(cpu_seconds(p) - self._cpu0.get(p, 0.0) for p in self.pids)
        rss = sum(peak_rss_bytes(p) for p in self.pids)
        return ProcUsage(cpu, rss)
