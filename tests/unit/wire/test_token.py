from __future__ import annotations

import pytest

from pidlease.errors import Unauthorized
from pidlease.wire.token import make_token, verify_token

SECRET = b"s3cret"


def test_valid_token_verifies_and_returns_expiry():
    tok = make_token(SECRET, 42, 7, 10_000)
    assert verify_token(SECRET, tok, 42, 7, now_ms=9_999) == 10_000


@pytest.mark.parametrize(
    ("token", "pid", "gen", "now", "why"),
    [
        ("", 42, 7, 0, "needs the lease token"),
        ("garbage", 42, 7, 0, "malformed"),
        ("v1.42.7.x.abc", 42, 7, 0, "malformed"),
        (make_token(b"other", 42, 7, 10_000), 42, 7, 0, "signature"),
        (make_token(SECRET, 42, 7, 10_000), 43, 7, 0, "not pid 43"),
        (make_token(SECRET, 42, 7, 10_000), 42, 8, 0, "generation 8"),
        (make_token(SECRET, 42, 7, 10_000), 42, 7, 10_000, "expired"),
    ],
)
def test_bad_tokens_are_refused(token, pid, gen, now, why):
    with pytest.raises(Unauthorized, match=why):
        verify_token(SECRET, token, pid, gen, now_ms=now)


def test_tampered_expiry_is_refused():
    tok = make_token(SECRET, 42, 7, 10_000).split(".")
    tok[3] = "99999999"
    with pytest.raises(Unauthorized, match="signature"):
        verify_token(SECRET, ".".join(tok), 42, 7, now_ms=0)
