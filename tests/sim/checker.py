"""The end-of-run check, on the logs as recovered from the files after a last SIGKILL.

For every partition, read back the whole log (``PartitionLog.read``, which verifies the
checksums) and assert:

- every record a producer was told is written (OK or DUPLICATE) is in the log, exactly
  once on strict and monotonic topics, at least once on ``off`` topics;
- per PID (strict, monotonic): sequences in log order strictly increase; on strict topics
  with no gap either, starting at 0;
- no data batch of a generation older than a fence that precedes it in the log (no fenced
  write admitted);
- each record's value names the sequence the batch gave it (nothing mixed up).
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from pidlease.wire import protocol as P
from pidlease.wire.cluster import PartitionState, partition_path

if TYPE_CHECKING:
    from tests.sim.world import World


def check(w: World) -> None:
    by_part: dict[tuple[str, int], list] = defaultdict(list)
    for lin in w.lineages:
        by_part[(lin.topic, lin.partition)].append(lin)
    for key, lins in sorted(by_part.items()):
        z = w.zk.nodes.get(partition_path(*key))
        if z is None:
            if any(lin.acked for lin in lins):
                w.violation(f"{key[0]}-{key[1]}: acked records but the topic does not exist")
            continue
        ps = PartitionState.from_bytes(z.data)
        srv = w.servers[ps.leader].server
        part = srv.broker.partitions.get(key) if srv is not None else None
        if part is None:
            if any(lin.acked for lin in lins):
                w.violation(
                    f"{key[0]}-{key[1]}: acked records but no partition on its leader "
                    f"{ps.leader} after recovery"
                )
            continue
        _check_partition(w, key, part, lins)
        if len(ps.replicas) > 1:
            _check_replicas(w, key, ps.replicas)


def _batches_below(part, end: int) -> list[bytes]:
    out = []
    for chunk in part.log.read(0, 1 << 40, end):
        for h, pos in P.iter_batches(chunk):
            if h.base_offset + h.count <= end:
                out.append(bytes(chunk[pos : pos + h.size]))
    return out


def _check_replicas(w: World, key: tuple[str, int], replicas: list[int]) -> None:
    """Any two replicas hold the same batches below the lower of their high watermarks."""
    parts = []
    for sid in replicas:
        srv = w.servers[sid].server
        part = srv.broker.partitions.get(key) if srv is not None else None
        if part is not None:
            parts.append((sid, part))
    for i, (sa, a) in enumerate(parts):
        for sb, b in parts[i + 1 :]:
            end = min(a.high_watermark, b.high_watermark)
            w.checks += 1
            if _batches_below(a, end) != _batches_below(b, end):
                w.violation(
                    f"{key[0]}-{key[1]}: servers {sa} and {sb} differ below the high "
                    f"watermark {end}"
                )


def _check_partition(w: World, key: tuple[str, int], part, lins: list) -> None:
    name = f"{key[0]}-{key[1]} ({lins[0].mode}, R{w.topics[key[0]].replication_factor})"
    seen: dict[bytes, int] = defaultdict(int)
    by_pid: dict[int, list[tuple[int, int, int, bool]]] = defaultdict(
        list
    )  # (gen, base, count, ctl)
    for chunk in part.log.read(0, 1 << 40, part.log.next_offset):
        for h, pos in P.iter_batches(chunk):
            w.checks += 1
            by_pid[h.pid].append((h.generation, h.base_sequence, h.count, h.is_control))
            if h.is_control:
                continue
            for rec in P.iter_records(chunk, h, pos):
                seen[rec.value] += 1
                parts = rec.value.split(b"/")
                if len(parts) >= 3 and int(parts[2]) != rec.sequence_id:
                    w.violation(
                        f"{name}: record {rec.value!r} stored with sequence {rec.sequence_id}"
                    )
    for lin in lins:
        dedup = lin.mode != "off"
        for value, (offset, dup) in lin.acked.items():
            w.checks += 1
            n = seen.get(value, 0)
            if n == 0:
                w.violation(
                    f"{name}: acked record {value.decode()} ({'DUPLICATE' if dup else 'OK'}"
                    f" at offset {offset}) is not in the log"
                )
            elif n > 1 and dedup:
                w.violation(f"{name}: record {value.decode()} is in the log {n} times")
        if not dedup:
            continue
        last = -1
        fence_gen = 0
        for gen, base, count, ctl in by_pid.get(lin.pid, []):
            w.checks += 1
            if ctl:
                fence_gen = max(fence_gen, gen)
                continue
            if gen < fence_gen:
                w.violation(
                    f"{name}: pid {lin.pid} batch [{base}..{base + count - 1}] of "
                    f"generation {gen} after the fence of generation {fence_gen}"
                )
            if base <= last:
                w.violation(
                    f"{name}: pid {lin.pid} batch [{base}..{base + count - 1}] after "
                    f"sequence {last}: not in sequence order"
                )
            elif lin.mode == "strict" and base != last + 1:
                w.violation(
                    f"{name}: pid {lin.pid} batch [{base}..{base + count - 1}] after "
                    f"sequence {last}: a gap on a strict topic"
                )
            last = max(last, base + count - 1)
    for lin in lins:
        if lin.mode == "off":
            continue
