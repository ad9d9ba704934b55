"""The processor's rules (pidlease/client/processor.py) against a model written from the
contract ("Consumers that also produce"): a processor killed at any point and started again
with the same name resumes exactly after the last input record whose outputs are all in
the output topic: no output lost, none written twice, in input order, also with fan-out.

The model of the output partition is what the contract and docs/sdk.md promise: the
producer's batches of one partition land as a prefix of what it sent (a refused or lost
batch blocks the later ones), and a restart's ``last_sequence_id`` is the highest id in
the log."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pidlease import errors
from pidlease.client.processor import (
    FENCED_RETRY_S,
    AsyncProcessor,
    ResumePlan,
    assigned_partitions,
    may_retake,
    output_partition,
    output_sequence,
    outputs_to_send,
    processor_group,
    producer_name,
    resume_plan,
    uses_group,
)


def test_sequence_mapping_examples() -> None:
    # fanout 1 (the mirror): the id is the input offset
    assert [output_sequence(o, 0, 1, 1) for o in (0, 5, 9)] == [0, 5, 9]
    # fanout 4: outputs 0, 1 then the end mark at index 3
    assert [output_sequence(10, i, 3, 4) for i in range(3)] == [40, 41, 43]
    assert output_sequence(10, 0, 1, 4) == 43  # a single output is its own end mark
    with pytest.raises(errors.ConfigError, match="fanout_max=2"):
        output_sequence(1, 0, 3, 2)


def test_resume_rule_examples() -> None:
    assert resume_plan(-1, 4) == ResumePlan(None)
    assert resume_plan(43, 4) == ResumePlan(11)  # end mark of 10: resume after it
    assert resume_plan(41, 4) == ResumePlan(10, 1)  # 10 half done: again, from output 2
    assert resume_plan(7, 1) == ResumePlan(8)
    assert [s for s, _ in outputs_to_send(10, [(None, b"a")] * 3, 4, ResumePlan(10, 1))] == [43]
    assert len(outputs_to_send(11, [(None, b"a")] * 3, 4, ResumePlan(10, 1))) == 3


def test_partition_assignment() -> None:
    assert assigned_partitions(6, instance=1, instances=2) == [1, 3, 5]
    assert assigned_partitions(6, explicit=[4, 0, 4]) == [0, 4]
    with pytest.raises(errors.ConfigError):
        assigned_partitions(6, explicit=[6])
    with pytest.raises(errors.ConfigError):
        assigned_partitions(6, instance=2, instances=2)
    assert output_partition(5, 6) == 5 and output_partition(5, 2) == 1
    assert producer_name("clean", "raw", 3) == "clean/raw/3"
    assert processor_group("clean") == "pidlease-processor/clean"


def test_a_fenced_partition_is_retaken_after_the_group_moved_on_or_the_retry_time() -> None:
    r = FENCED_RETRY_S
    assert not may_retake(100.0, 100.0, 4, 4)  # just fenced, same generation: leave it
    assert not may_retake(100.0 + r - 0.1, 100.0, 4, 4)
    assert may_retake(100.0 + r, 100.0, 4, 4)  # the other holder had its time
    assert may_retake(100.1, 100.0, 4, 5)  # a new generation: the group decided again


@pytest.mark.parametrize(
    "static",
    [
        {"partitions": [0]},
        {"instances": 2},
        {"until_caught_up": True},
    ],
)
def test_group_mode_refuses_the_static_assignment_flags(static: dict[str, object]) -> None:
    with pytest.raises(errors.ConfigError, match="group=True"):
        AsyncProcessor("http://127.0.0.1:1", "raw", "clean", "n", list, group=True, **static)  # type: ignore[arg-type]
    # without group=True the same flags choose the static assignment
    p = AsyncProcessor("http://127.0.0.1:1", "raw", "clean", "n", list, **static)  # type: ignore[arg-type]
    assert not p.group


def test_instances_with_a_name_share_partitions_through_the_group_by_default() -> None:
    assert uses_group(None, until_caught_up=False)  # the contract's default
    assert not uses_group(False, until_caught_up=False)  # the explicit opt-out
    assert uses_group(True, until_caught_up=False)
    assert not uses_group(None, partitions=[0, 2], until_caught_up=False)
    assert not uses_group(None, instances=2, until_caught_up=False)
    assert not uses_group(None, until_caught_up=True)
    url = "http://127.0.0.1:1"
    assert AsyncProcessor(url, "raw", "clean", "n", list).group  # type: ignore[arg-type]
    # TLS and tokens no longer force the static assignment: the member uses them too
    tls = {"api_token": "t", "tls_ca_file": "ca.pem"}
    assert AsyncProcessor(url, "raw", "clean", "n", list, **tls).group  # type: ignore[arg-type]
    assert AsyncProcessor(url, "raw", "clean", "n", list, group=True, **tls).group  # type: ignore[arg-type]


@st.composite
def runs(draw: st.DrawFn) -> tuple[int, list[int], list[int], list[int]]:
    fanout = draw(st.integers(1, 4))
    counts = draw(st.lists(st.integers(0, fanout), min_size=0, max_size=25))
    # input offsets: increasing with holes (control records take offsets)
    gaps = draw(st.lists(st.integers(1, 3), min_size=len(counts), max_size=len(counts)))
    offsets = [sum(gaps[: i + 1]) - 1 for i in range(len(counts))]
    crashes = draw(st.lists(st.integers(0, 200), max_size=5))
    return fanout, counts, offsets, crashes


@settings(max_examples=400, deadline=None)
@given(runs())
def test_any_crash_point_gives_each_output_exactly_once(
    case: tuple[int, list[int], list[int], list[int]],
) -> None:
    fanout, counts, offsets, crashes = case
    expected = [(o, i) for o, k in zip(offsets, counts, strict=True) for i in range(k)]
    log: list[tuple[int, tuple[int, int]]] = []  # (sequence id, (offset, index)) durable

    def run(landing: int | None) -> None:
        """One life of the processor: sends from the resume point; only the first
        ``landing`` sends reach the log (None: all), as a crash cutting a prefix."""
        last = log[-1][0] if log else -1
        plan = resume_plan(last, fanout)
        start = 0 if plan.offset is None else plan.offset
        sent = 0
        for o, k in zip(offsets, counts, strict=True):
            if o < start:
                continue
            outs = [(None, (o, i)) for i in range(k)]
            for seq, (_key, value) in outputs_to_send(o, outs, fanout, plan):  # type: ignore[arg-type]
                if landing is not None and sent >= landing:
                    return
                top = log[-1][0] if log else -1
                # the SDK would resolve an id at or below the log's top as a duplicate
                # without sending it: the rule must never produce one
                assert seq > top, (seq, top)
                log.append((seq, value))  # type: ignore[arg-type]
                sent += 1

    for cut in crashes:
        run(cut)
    run(None)
    assert [v for _, v in log] == expected
    assert [s for s, _ in log] == sorted({s for s, _ in log})
