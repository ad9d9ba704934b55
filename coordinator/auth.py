"""Principals, scopes and the scope table of the coordinator's HTTP API.

A principal is a named holder of an API token with one scope:

- ``producer``: may lease (``POST /v1/lease_pid``, ``/v1/lease_pid/batch``), read topics
  (``GET /v1/topics``, ``GET /v1/topics/{name}``) and read its own PIDs
  (``GET /v1/pids/{pid}``); it may renew or take over only the PIDs it owns (the
  principal that first leased a PID, kept on the PID's record in ZooKeeper);
- ``admin``: everything, including taking over any PID.

Principals come from ``api_tokens`` ("name:scope:token,..."), ``api_tokens_file`` (one
"name:scope:token" a line, ``#`` comments and blank lines allowed) and the older single
``api_token`` (an admin named ``admin``). With none configured, every call is made by
``anonymous`` with the admin scope, as before tokens existed.

Tokens are compared in constant time: every configured token's SHA-256 digest is compared
with the presented one's, always all of them, so neither the position nor the length of a
match shows in the timing. Pure functions and data only; ``guard.py`` applies them.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

ADMIN = "admin"
PRODUCER = "producer"
SCOPES = (ADMIN, PRODUCER)
ANONYMOUS_NAME = "anonymous"
LEGACY_ADMIN_NAME = "admin"
NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
TOKEN_MIN = 8
COOKIE_NAME = "pidlease_dashboard_token"


class PrincipalConfigError(ValueError):
    """A malformed principal entry; the message names where it is and what is wrong."""


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    scope: str
    token_digest: bytes = field(default=b"", repr=False, compare=False)

    def allows(self, needed: str | None) -> bool:
        return needed is None or self.scope in (ADMIN, needed)

    @property
    def is_admin(self) -> bool:
        return self.scope == ADMIN


ANONYMOUS = Principal(ANONYMOUS_NAME, ADMIN)


def _digest(token: str | bytes) -> bytes:
    raw = token.encode() if isinstance(token, str) else token
    return hashlib.sha256(raw).digest()


def parse_entry(entry: str, where: str) -> Principal:
    """One "name:scope:token" (the token may itself contain ':')."""
    parts = entry.strip().split(":", 2)
    if len(parts) != 3:
        raise PrincipalConfigError(f"{where}: expected name:scope:token, got {len(parts)} field(s)")
    name, scope, token = (p.strip() for p in parts)
    if not NAME_RE.match(name):
        raise PrincipalConfigError(
            f"{where}: principal name {name!r} must be 1..64 letters, digits, '.', '_' or '-'"
        )
    if name == ANONYMOUS_NAME:
        raise PrincipalConfigError(f"{where}: the name {ANONYMOUS_NAME!r} is reserved")
    if scope not in SCOPES:
        raise PrincipalConfigError(
            f"{where}: principal {name!r} has scope {scope!r}; use one of {', '.join(SCOPES)}"
        )
    if len(token) < TOKEN_MIN or any(c.isspace() or c == "," for c in token):
        raise PrincipalConfigError(
            f"{where}: the token of principal {name!r} must be at least "
            f"{TOKEN_MIN} characters without spaces or commas"
        )
    return Principal(name, scope, _digest(token))


def parse_list(text: str, source: str = "api_tokens") -> list[Principal]:
    """The comma-separated form; empty entries (a trailing comma) are ignored."""
    return [
        parse_entry(e, f"{source} entry {i + 1}")
        for i, e in enumerate(text.split(","))
        if e.strip()
    ]


def parse_file(path: str | Path) -> list[Principal]:
    """One entry a line; blank lines and lines starting with ``#`` are skipped."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise PrincipalConfigError(f"api_tokens_file {str(path)!r} cannot be read: {exc}") from exc
    return [
        parse_entry(line, f"api_tokens_file {path} line {n}")
        for n, line in enumerate(lines, 1)
        if line.strip() and not line.lstrip().startswith("#")
    ]


def build_principals(
    api_token: str = "", api_tokens: str = "", api_tokens_file: str = ""
) -> list[Principal]:
    """Every configured principal, checked for clashing names and tokens."""
    out: list[Principal] = []
    if api_token:
        out.append(Principal(LEGACY_ADMIN_NAME, ADMIN, _digest(api_token)))
    out += parse_list(api_tokens)
    if api_tokens_file:
        out += parse_file(api_tokens_file)
    names: set[str] = set()
    digests: set[bytes] = set()
    for p in out:
        if p.name in names:
            extra = " (api_token is the principal 'admin')" if p.name == LEGACY_ADMIN_NAME else ""
            raise PrincipalConfigError(f"principal {p.name!r} is configured twice{extra}")
        if p.token_digest in digests:
            raise PrincipalConfigError(f"principal {p.name!r} has the same token as another one")
        names.add(p.name)
        digests.add(p.token_digest)
    return out


def own_login(
    api_token: str = "", api_tokens: str = "", api_tokens_file: str = ""
) -> tuple[str, str] | None:
    """The (name, token) the coordinator logs in with where it is a client of the
    partition servers' Kafka listeners (the groups view: SASL/PLAIN, the same principals):
    the first admin principal configured (``api_token`` first, then ``api_tokens``, then
    the file), else the first principal of any scope (describing groups needs no scope);
    None without principals. The entries were checked by ``build_principals``."""
    entries: list[tuple[str, str, str]] = []
    if api_token:
        entries.append((LEGACY_ADMIN_NAME, ADMIN, api_token))
    lines = [e for e in api_tokens.split(",") if e.strip()]
    if api_tokens_file:
        lines += [
            line
            for line in Path(api_tokens_file).read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")
        ]
    for line in lines:
        name, scope, token = (x.strip() for x in line.strip().split(":", 2))
        entries.append((name, scope, token))
    for name, scope, token in entries:
        if scope == ADMIN:
            return name, token
    return (entries[0][0], entries[0][2]) if entries else None


class Authenticator:
    """Finds the principal of a presented token; ``enabled`` is False with no principals."""

    def __init__(self, principals: Iterable[Principal]) -> None:
        self.principals = list(principals)

    @property
    def enabled(self) -> bool:
        return bool(self.principals)

    def by_token(self, token: str | bytes) -> Principal | None:
        given = _digest(token)
        found: Principal | None = None
        for p in self.principals:  # no early exit: the same work whoever matches
            if hmac.compare_digest(given, p.token_digest):
                found = p
        return found

    def by_authorization(self, header: bytes) -> Principal | None:
        scheme, _, token = header.partition(b" ")
        if scheme.lower() != b"bearer" or not token.strip():
            return None
        return self.by_token(token.strip())


# -- the scope table ---------------------------------------------------------------------------
# (method, path pattern) -> scope needed; "*" is exactly one non-empty path segment. A /v1
# route not listed here needs admin; any other path is open unless listed in GUARDED_OTHER.
PRODUCER_ROUTES: tuple[tuple[str, str], ...] = (
    ("POST", "/v1/lease_pid"),
    ("POST", "/v1/lease_pid/batch"),
    ("GET", "/v1/topics"),
    ("GET", "/v1/topics/*"),
    ("GET", "/v1/pids/*"),
    # where the Kafka listeners (group coordinators) are: a consumer group member, processor
    # or mirror with a producer token finds them here, as any authenticated Kafka client
    # learns the brokers from Metadata
    ("GET", "/v1/servers"),
)
GUARDED_OTHER = ("/dashboard", "/dashboard/data")


def _matches(pattern: str, path: str) -> bool:
    ps, xs = pattern.split("/"), path.split("/")
    return len(ps) == len(xs) and all(
        p == x or (p == "*" and x) for p, x in zip(ps, xs, strict=True)
    )


def required_scope(method: str, path: str) -> str | None:
    """The scope a call needs, or None for an open one (health, metrics, the schema, the
    dashboard's static assets)."""
    if path == "/v1" or path.startswith("/v1/"):
        if any(m == method and _matches(pat, path) for m, pat in PRODUCER_ROUTES):
            return PRODUCER
        return ADMIN
    if path in GUARDED_OTHER:
        return ADMIN
    return None
