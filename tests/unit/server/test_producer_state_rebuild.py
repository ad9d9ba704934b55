"""The rules of rebuilding producer state (producer_state.py: ``pids_with_data``,
``cut_row``, ``adopt_rows``, ``row_below``), held to a reference model that knows a PID's
whole history, not only the K batches its row keeps (issue 23 items 2 and 4)."""

from __future__ import annotations

from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from partition_server.producer_state import (
    Outcome,
    ProducerStateTable,
    adopt_rows,
    cut_row,
    pids_with_data,
    row_below,
)
from pidlease.wire.protocol import FLAG_CONTROL, BatchHeader


def header(pid: int, offset: int, control: bool) -> BatchHeader:
    flags = FLAG_CONTROL if control else 0
    return BatchHeader(offset, 60, 0, flags, pid, 1, -1 if control else 0, 1, 0)


def test_a_fence_is_not_a_data_batch() -> None:
    hs = [header(7, 10, True), header(8, 11, False), header(9, 30, False)]
    assert all(h.is_control == (h.pid == 7) for h in hs)
    assert pids_with_data(hs, 20) == {8}  # 7 only fenced, 9 at or above the end


@settings(max_examples=400, deadline=None)
@given(
    committed=st.lists(st.integers(1, 4), max_size=8),
    cut=st.lists(st.integers(1, 4), max_size=8),
    k=st.integers(1, 5),
    gap=st.integers(0, 3),
)
def test_cut_row_gives_the_committed_state_whatever_k_kept(
    committed: list[int], cut: list[int], k: int, gap: int
) -> None:
    """A PID's committed batches (below the log start ``end``: retention deleted them) and
    its batches above the high watermark (at or after ``end``: a cut drops them). Whatever
    K kept, the rewound row is the committed state: highwater the last committed sequence,
    batches only committed ones, and the PID gone when nothing was committed."""
    t = ProducerStateTable(batches_kept=k)
    seq = off = 0
    batches: list[tuple[int, int, int]] = []
    for n in committed:
        t.apply_append(7, 0, seq, n, off, 1, durable=True)
        batches.append((seq, seq + n - 1, off))
        seq, off = seq + n, off + n
    end = off + gap  # other producers' batches in between
    off = end
    for n in cut:
        t.apply_append(7, 0, seq, n, off, 1, durable=False)
        seq, off = seq + n, off + n
    if 7 not in t:
        assert not committed and not cut
        return
    [row] = t.export_rows([7])
    dhw = t.durable_lags([7]).get(7, row[2])
    got = cut_row(row, end, dhw)
    if not committed:
        assert got is None
        return
    assert got is not None
    pid, gen, hw, _, flat = got
    assert (pid, gen, hw) == (7, 0, batches[-1][1])
    kept = [(flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]
    assert kept == batches[len(batches) - len(kept) :]  # a suffix of the committed ones
    again = ProducerStateTable(batches_kept=k)
    again.load_rows([got])
    assert again.check_append(7, 0, hw + 1, 1).outcome is Outcome.APPEND
    assert again.check_append(7, 0, hw, 1).outcome is Outcome.DUPLICATE
    # Without the durable highwater (a snapshot from before PLSNAP05) the row is dropped
    # only when its kept batches were all cut; else it is rewound the same way.
    old = cut_row(row, end, None)
    assert old is None if not kept else old == got


@given(
    mine=st.dictionaries(st.integers(1, 6), st.tuples(st.integers(0, 5), st.integers(0, 9))),
    theirs=st.dictionaries(st.integers(1, 6), st.tuples(st.integers(0, 5), st.integers(0, 9))),
)
def test_adopted_rows_win_but_never_lower_a_generation_or_a_last_use(
    mine: dict[int, tuple[int, int]], theirs: dict[int, tuple[int, int]]
) -> None:
    def rows(d: dict[int, tuple[int, int]], hw: int) -> list:  # type: ignore[type-arg]
        return [(pid, gen, hw, lu, array("q")) for pid, (gen, lu) in d.items()]

    out = {r[0]: r for r in adopt_rows(rows(mine, 1), rows(theirs, 2))}
    assert set(out) == set(mine) | set(theirs)
    for pid, (_, gen, hw, lu, _) in out.items():
        if pid in theirs:
            assert hw == 2
            assert gen == max(theirs[pid][0], mine.get(pid, (0, 0))[0])
            assert lu == max(theirs[pid][1], mine.get(pid, (0, 0))[1])
        else:
            assert (gen, hw, lu) == (mine[pid][0], 1, mine[pid][1])


@settings(max_examples=400, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 3), max_size=10),
    start_at=st.integers(0, 10),
    held=st.integers(0, 10),
    k=st.integers(1, 5),
)
def test_a_start_over_with_the_leaders_rows_below_its_start_ends_as_the_leader(
    sizes: list[int], start_at: int, held: int, k: int
) -> None:
    """A PID wrote batches of ``sizes`` records; the leader's log starts at the batch
    ``start_at`` (retention deleted those below, all committed). A follower that held the
    first ``held`` batches below it starts over there: it adopts the leader's row as of
    the start (``row_below``) and replays the batches from it. Whatever K, it then keeps
    the leader's row (simulation seed 500201: it skipped from its own batches to the
    fetched ones)."""
    offs, seq, off = [], 0, 0
    for n in sizes:
        offs.append((seq, n, off))
        seq, off = seq + n, off + n + 1  # another producer's batch after each
    start_at = min(start_at, len(offs))
    start = offs[start_at][2] if start_at < len(offs) else off
    lead = ProducerStateTable(batches_kept=k)
    for b, n, o in offs:
        lead.apply_append(7, 0, b, n, o, 1, durable=True)
    fol = ProducerStateTable(batches_kept=k)
    for b, n, o in offs[: min(held, start_at)]:
        fol.apply_append(7, 0, b, n, o, 1, durable=True)
    theirs = [r for r in (row_below(r, start) for r in lead.export_rows()) if r is not None]
    fol.load_rows(adopt_rows(fol.export_rows(), theirs))
    for b, n, o in offs[start_at:]:
        fol.apply_append(7, 0, b, n, o, 1, durable=True)
    assert [r[2:5:2] for r in fol.export_rows()] == [r[2:5:2] for r in lead.export_rows()]
    if 7 in lead:
        [(_, _, hw, _, flat)] = lead.export_rows([7])
        for b in {flat[i] for i in range(0, len(flat), 3)}:
            assert fol.check_append(7, 0, b, 1).outcome is Outcome.DUPLICATE
        assert fol.check_append(7, 0, hw + 1, 1).outcome is Outcome.APPEND
