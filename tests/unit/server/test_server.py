"""Pure helpers of the partition server's connection handling (partition_server/server.py):
the codes the refusal guard answers, and the memo of missing partitions."""

from __future__ import annotations

from partition_server import server as S
from pidlease import errors
from pidlease.client.retry import retriable as _retriable


def test_the_sdk_retries_every_code_the_guard_answers() -> None:
    """A held-back batch is answered with the code of the refusal that holds it: the SDK
    must retry it (and so resend in order), never fail the producer."""
    assert errors.UnknownTopicOrPartition.code in S._GUARDED_CODES
    assert {
        errors.NotLeader.code,
        errors.ServerUnavailable.code,
        errors.TooManyPids.code,
        errors.SequenceUnknown.code,
    } <= S._GUARDED_CODES
    for code in S._GUARDED_CODES:
        assert _retriable(errors.error_for_code(code, "held back")), code


def test_missing_partitions_memo() -> None:
    """After a re-read that did not find a partition, requests for it are answered for a
    moment without another re-read; the memo is bounded."""
    memo: dict[tuple[str, int], float] = {}
    assert not S._recently_missing(memo, ("t", 0), 100.0)
    S._note_missing(memo, ("t", 0), 100.0)
    assert S._recently_missing(memo, ("t", 0), 100.5)
    assert not S._recently_missing(memo, ("t", 1), 100.5)
    assert not S._recently_missing(memo, ("t", 0), 100.0 + S.MISSING_MEMO_S)  # read again
    for i in range(S.MISSING_MEMO_KEYS_MAX + 10):
        S._note_missing(memo, ("x", i), 200.0 + i)
    assert len(memo) == S.MISSING_MEMO_KEYS_MAX and ("x", 0) not in memo
