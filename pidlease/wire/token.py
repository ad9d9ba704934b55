"""Lease tokens: the coordinator's signature over (pid, generation, expiry).

A partition server holds the same shared secret and accepts an idempotent append only
with a token for exactly the batch's pid and generation that has not expired. The token
is a plain string so it travels in HTTP JSON and in the binary protocol alike:

    v1.<pid>.<generation>.<expires_at_ms>.<hex HMAC-SHA256, first 32 chars>
"""

from __future__ import annotations

import hashlib
import hmac

from pidlease.errors import Unauthorized

_VERSION = "v1"
_SIG_CHARS = 32


def _sign(secret: bytes, pid: int, generation: int, expires_at_ms: int) -> str:
    msg = f"{_VERSION}.{pid}.{generation}.{expires_at_ms}".encode()
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()[:_SIG_CHARS]


def make_token(secret: bytes, pid: int, generation: int, expires_at_ms: int) -> str:
    signature = _sign(secret, pid, generation, expires_at_ms)
    return f"{_VERSION}.{pid}.{generation}.{expires_at_ms}.{signature}"


def parse_token(token: str) -> tuple[int, int, int, str]:
    """(pid, generation, expires_at_ms, signature); raises Unauthorized when malformed."""
    parts = token.split(".")
    if len(parts) != 5 or parts[0] != _VERSION:
        raise Unauthorized("lease token is missing or malformed; lease the PID again")
    try:
        pid, gen, exp = int(parts[1]), int(parts[2]), int(parts[3])
    except ValueError as exc:
        raise Unauthorized("lease token is malformed; lease the PID again") from exc
    return pid, gen, exp, parts[4]


def verify_token(secret: bytes, token: str, pid: int, generation: int, now_ms: int) -> int:
    """Check a token for (pid, generation) at ``now_ms``; returns its expiry.

    Raises Unauthorized when the token is missing, forged, for another pid or
    generation, or expired."""
    if not token:
        raise Unauthorized("an idempotent append needs the lease token from lease_pid")
    tpid, tgen, exp, sig = parse_token(token)
    if not hmac.compare_digest(sig, _sign(secret, tpid, tgen, exp)):
        raise Unauthorized("lease token signature is wrong (forged, or another cluster's secret)")
    if tpid != pid or tgen != generation:
        raise Unauthorized(
            f"lease token is for pid {tpid} generation {tgen}, "
            f"not pid {pid} generation {generation}"
        )
    if now_ms >= exp:
        raise Unauthorized("lease token expired; renew the lease before it lapses")
    return exp
