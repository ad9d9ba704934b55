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

Retention deletes the old end of a log: the simulation keeps every batch a deletion took
(``World.deleted``, from any server), so these checks run on the partition's whole
history: the batches kept aside below the log start of the replica read, then what its
log holds. That history must have no hole below the log start (nothing went without a
deletion that kept it), and an acked record may be missing from the log only when it was
deleted by retention, i.e. it is in that history below the log start. A resend that
retention made the server forget (a second copy, a sequence written again from 0, a
DUPLICATE for a batch never written) breaks exactly once or sequence order there.
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
        part = srv.log_manager.partitions.get(key) if srv is not None else None
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


def _batches_below(part, start: int, end: int) -> list[bytes]:
    out = []
    for chunk in part.log.read(start, 1 << 40, end):
        for h, pos in P.iter_batches(chunk):
            if h.base_offset >= start and h.base_offset + h.count <= end:
                out.append(bytes(chunk[pos : pos + h.size]))
    return out


def _check_replicas(w: World, key: tuple[str, int], replicas: list[int]) -> None:
    """Any two replicas hold the same batches below the lower of their high watermarks
    (from the later of their log starts: each deletes on its own clock)."""
    parts = []
    for sid in replicas:
        srv = w.servers[sid].server
        part = srv.log_manager.partitions.get(key) if srv is not None else None
        if part is not None:
            parts.append((sid, part))
    for i, (sa, a) in enumerate(parts):
        for sb, b in parts[i + 1 :]:
            end = min(a.high_watermark, b.high_watermark)
            start = max(a.log.log_start_offset, b.log.log_start_offset)
            w.checks += 1
            if _batches_below(a, start, end) != _batches_below(b, start, end):
                w.violation(
                    f"{key[0]}-{key[1]}: servers {sa} and {sb} differ below the high "
                    f"watermark {end}"
                )


def _history(w: World, key: tuple[str, int], part, name: str) -> list[bytes]:
    """The partition's batches from offset 0: those retention deleted below the log start
    of ``part`` (kept aside by the simulation), then ``part``'s log."""
    start = part.log.log_start_offset
    deleted = w.deleted.get(key, {})
    out: list[bytes] = []
    end = 0
    for base in sorted(b for b in deleted if b < start):
        w.checks += 1
        if base != end:
            break
        raw = deleted[base]
        out.append(raw)
        h = P.decode_batch_header(raw)
        end = base + h.count
    if end != start:
        w.violation(
            f"{name}: the log starts at {start}, but what retention deleted covers only "
            f"[0, {end}): a hole below the log start"
        )
    out += part.log.read(start, 1 << 40, part.log.next_offset)
    return out


def _check_partition(w: World, key: tuple[str, int], part, lins: list) -> None:
    name = f"{key[0]}-{key[1]} ({lins[0].mode}, R{w.topics[key[0]].replication_factor})"
    seen: dict[bytes, int] = defaultdict(int)
    at_offset: dict[int, bytes] = {}  # offset -> the record there (data batches)
    by_pid: dict[int, list[tuple[int, int, int, bool]]] = defaultdict(
        list
    )  # (gen, base, count, ctl)
    for chunk in _history(w, key, part, name):
        for h, pos in P.iter_batches(chunk):
            w.checks += 1
            by_pid[h.pid].append((h.generation, h.base_sequence, h.count, h.is_control))
            if h.is_control:
                continue
            for i, rec in enumerate(P.iter_records(chunk, h, pos)):
                seen[rec.value] += 1
                at_offset[h.base_offset + i] = rec.value
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
                where = (
                    " (above the log start)"
                    if offset >= part.log.log_start_offset
                    else " (nor among the batches retention deleted)"
                    if part.log.log_start_offset
                    else ""
                )
                w.violation(
                    f"{name}: acked record {value.decode()} ({'DUPLICATE' if dup else 'OK'}"
                    f" at offset {offset}) is not in the log{where}"
                )
            elif n > 1 and dedup:
                w.violation(
                    f"{name}: record {value.decode()} is in the log {n} times",
                    pid_at=(key, lin.pid),
                )
            if offset >= 0 and n and at_offset.get(offset, value) != value:
                # The answer named an offset that holds another record (an ack resolved by
                # somebody else's batch at that offset).
                other = at_offset[offset].decode()
                w.violation(
                    f"{name}: acked record {value.decode()} ({'DUPLICATE' if dup else 'OK'} at "
                    f"offset {offset}) is not in the log at that offset, which holds {other}"
                )
            elif offset >= 0 and n == 0 and offset in at_offset:
                w.trace(
                    "check",
                    f"{name}: offset {offset} acked for {value.decode()} holds "
                    f"{at_offset[offset].decode()}",
                )
        if not dedup:
            continue
        for gen, resumed_after, acked_max in lin.resumes:
            w.checks += 1
            if resumed_after < acked_max:
                w.violation(
                    f"{name}: pid {lin.pid} takeover by generation {gen} resumed after "
                    f"sequence {resumed_after}, below sequence {acked_max} already acked: "
                    f"a takeover started below the acked highwater",
                    pid_at=(key, lin.pid),
                )
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
                    f"generation {gen} after the fence of generation {fence_gen}",
                    pid_at=(key, lin.pid),
                )
            if base <= last:
                w.violation(
                    f"{name}: pid {lin.pid} batch [{base}..{base + count - 1}] after "
                    f"sequence {last}: not in sequence order",
                    pid_at=(key, lin.pid),
                )
            elif (lin.mode == "strict" or lin.kind == "kafka") and base != last + 1:
                w.violation(
                    f"{name}: pid {lin.pid} batch [{base}..{base + count - 1}] after "
                    f"sequence {last}: a gap on a strict topic",
                    pid_at=(key, lin.pid),
                )
            last = max(last, base + count - 1)
    for lin in lins:
        if lin.mode == "off":
            continue
