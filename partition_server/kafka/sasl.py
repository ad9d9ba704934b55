"""SASL/PLAIN for the Kafka listener: the coordinator's API tokens, checked here.

A Kafka client authenticates as user = principal name, password = that principal's API
token, from the same ``api_tokens`` / ``api_tokens_file`` / ``api_token`` settings (and
``PIDLEASE_*`` variables) the coordinator reads, so one configuration serves both doors.
With no token configured, the listener needs no SASL and every client is ``anonymous``.

Tokens are compared as SHA-256 digests against every configured one, always all of them,
so neither which entry matched nor a prefix of it shows in the timing (as the
coordinator's ``auth.py`` does; the partition server may not import it).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from pathlib import Path

ANONYMOUS = "anonymous"
LEGACY_ADMIN = "admin"
SCOPES = ("admin", "producer")


class SaslConfigError(ValueError):
    """A malformed principal entry."""


@dataclass(frozen=True)
class Principals:
    """Name -> (scope, SHA-256 digest of its token)."""

    entries: dict[str, tuple[str, bytes]]

    @property
    def required(self) -> bool:
        return bool(self.entries)

    def check(self, user: str, password: str) -> str | None:
        """The scope of ``user`` when ``password`` is its token, else None."""
        who = self.identify(user, password)
        return None if who is None else who[1]

    def identify(self, user: str, password: str) -> tuple[str, str] | None:
        """(principal, scope) of ``user`` when ``password`` is its token, else None. An
        empty ``user`` is the principal whose token ``password`` is, as at the
        coordinator's HTTP door, where the token alone names the caller (the SDK's
        ``Consumer`` sends only its ``api_token``); a token two principals share names
        neither."""
        presented = hashlib.sha256(password.encode()).digest()
        found: list[tuple[str, str]] = []
        for name, (scope, digest) in self.entries.items():
            match = hmac.compare_digest(presented, digest)
            named = hmac.compare_digest(name.encode(), user.encode())
            if match and (named or not user):
                found.append((name, scope))
        return found[0] if len(found) == 1 else None


def load_principals(api_token: str, api_tokens: str, api_tokens_file: str) -> Principals:
    """The principals of the three settings, in the coordinator's formats:
    ``name:scope:token`` entries (comma separated, or one a line in the file, ``#``
    comments allowed) and the single legacy ``api_token`` (a principal named ``admin``)."""
    entries: list[tuple[str, str]] = []
    for i, raw in enumerate(x.strip() for x in api_tokens.split(",")):
        if raw:
            entries.append((f"api_tokens entry {i + 1}", raw))
    if api_tokens_file:
        try:
            lines = Path(api_tokens_file).read_text().splitlines()
        except OSError as exc:
            raise SaslConfigError(f"api_tokens_file {api_tokens_file}: {exc}") from exc
        for n, text in enumerate(lines, 1):
            entry = text.split("#", 1)[0].strip()
            if entry:
                entries.append((f"{api_tokens_file} line {n}", entry))
    out: dict[str, tuple[str, bytes]] = {}
    for where, raw in entries:
        name, scope, token = _split(where, raw)
        if scope not in SCOPES:
            raise SaslConfigError(f"{where}: scope must be one of {', '.join(SCOPES)}")
        out[name] = (scope, hashlib.sha256(token.encode()).digest())
    if api_token:
        out.setdefault(LEGACY_ADMIN, ("admin", hashlib.sha256(api_token.encode()).digest()))
    return Principals(out)


def _split(where: str, raw: str) -> tuple[str, str, str]:
    parts = raw.split(":", 2)
    if len(parts) != 3 or not all(parts):
        raise SaslConfigError(f"{where}: expected name:scope:token")
    return parts[0], parts[1], parts[2]


def parse_plain(auth_bytes: bytes) -> tuple[str, str] | None:
    """(user, password) of a SASL/PLAIN message ``[authzid] NUL authcid NUL passwd``
    (RFC 4616), or None when malformed or when it asks to act as somebody else. An empty
    user (with no authzid) is kept: ``Principals.identify`` finds it by its token."""
    parts = auth_bytes.split(b"\0")
    if len(parts) != 3:
        return None
    try:
        authzid, user, password = (p.decode() for p in parts)
    except UnicodeDecodeError:
        return None
    if (not user and authzid) or (authzid and authzid != user):
        return None
    return user, password
