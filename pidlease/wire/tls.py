"""TLS for pidlease's two ports: SSL contexts for the partition servers' binary protocol
and the coordinator's HTTPS, and the errors a failed handshake turns into.

The rule everything follows: **a process with TLS turned on speaks TLS to its peers**. A
partition server with ``tls_certfile``/``tls_keyfile`` set serves TLS and, as a replica
fetcher, connects to the other servers with TLS, trusting ``tls_ca_file`` (the system
store when empty); a coordinator with them set serves HTTPS and calls the partition servers
(FENCE, PRODUCER_STATE, METADATA) over TLS the same way. A cluster is all-TLS or
all-plaintext. Clients (``Producer``, ``AsyncProducer``, ``Reader``, the lease clients)
use TLS to partition servers when given ``tls_ca_file=`` (a CA bundle) or ``tls=True``
(the system trust store), and HTTPS whenever the coordinator URL is ``https://``; with
neither argument they fall back to ``PIDLEASE_TLS_CA_FILE`` from the environment, as the
API token falls back to ``PIDLEASE_API_TOKEN``.

Certificates are checked as a browser would: the server's certificate must be signed by a
trusted CA and name the address it is reached at (``subjectAltName`` ``IP:127.0.0.1`` or
``DNS:server1.example``). TLS 1.2 is the oldest version either side accepts.
"""

from __future__ import annotations

import os
import ssl

from pidlease import errors

TLS_CA_FILE_ENV = "PIDLEASE_TLS_CA_FILE"
HANDSHAKE_TIMEOUT_S = 10.0


def _load_verify(ctx: ssl.SSLContext, ca_file: str) -> None:
    try:
        ctx.load_verify_locations(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise errors.ConfigError(f"cannot load the TLS CA bundle {ca_file!r}: {exc}") from exc


def client_ssl_context(
    tls_ca_file: str | None = None, tls: bool = False, *, use_env: bool = True
) -> ssl.SSLContext | None:
    """The context a client connects to partition servers with, or None for plaintext.
    ``tls_ca_file``: trust this CA bundle; ``tls=True`` alone: the system trust store;
    neither: ``PIDLEASE_TLS_CA_FILE`` when set (``use_env``), else plaintext."""
    if tls_ca_file is not None and not isinstance(tls_ca_file, (str, os.PathLike)):
        raise errors.ConfigError(f"tls_ca_file must be a path, not {type(tls_ca_file).__name__}")
    if not isinstance(tls, bool):
        raise errors.ConfigError(f"tls must be True or False, not {tls!r}")
    ca = os.fspath(tls_ca_file) if tls_ca_file else None
    if ca is None and not tls and use_env:
        ca = os.environ.get(TLS_CA_FILE_ENV) or None
    if ca is None and not tls:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca is not None:
        _load_verify(ctx, ca)
    return ctx


def server_ssl_context(certfile: str, keyfile: str) -> ssl.SSLContext:
    """The listening side's context (TLS 1.2+). Unreadable or mismatched files raise
    ValueError with the file names, so a server refuses to start with a clear message."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(
            f"cannot load the TLS certificate {certfile!r} with key {keyfile!r}: {exc}"
        ) from exc
    return ctx


def peer_ssl_context(certfile: str, ca_file: str) -> ssl.SSLContext | None:
    """What a TLS-enabled server (or coordinator) uses to reach partition servers: TLS when
    it serves TLS itself (``certfile`` set), trusting ``ca_file`` (system store if empty)."""
    if not certfile:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca_file:
        try:
            ctx.load_verify_locations(cafile=ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"cannot load the TLS CA bundle {ca_file!r}: {exc}") from exc
    return ctx


def find_cert_error(exc: BaseException | None) -> ssl.SSLCertVerificationError | None:
    """The certificate verification failure in ``exc``'s cause chain, if any."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, ssl.SSLCertVerificationError):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def connect_error(
    address: str, exc: BaseException, what: str = "partition server"
) -> errors.PidleaseError:
    """A failed connect as a pidlease error: a certificate the client does not trust is
    ``Unauthorized`` (not retriable: retrying cannot help), anything else is retriable."""
    cert = find_cert_error(exc)
    if cert is not None:
        return errors.Unauthorized(
            f"TLS certificate verification of {what} {address} failed: "
            f"{cert.verify_message or cert} (is tls_ca_file the CA that signed its certificate, "
            f"and does the certificate name {address.rpartition(':')[0]}?)"
        )
    if isinstance(exc, ssl.SSLError):
        return errors.ServerUnavailable(
            f"TLS handshake with {what} {address} failed: {exc} (does it serve TLS?)"
        )
    return errors.ServerUnavailable(f"cannot connect to {what} {address}: {exc or 'timed out'}")
