"""TLS settings and client contexts without a network: one file without the other is a
clear settings error, unreadable files are named, the SDK's CA falls back to
PIDLEASE_TLS_CA_FILE, and a certificate failure from httpx is a non-retriable error."""

from __future__ import annotations

import ssl

import httpx
import pytest
from pydantic import ValidationError

from coordinator.settings import CoordinatorSettings
from partition_server.settings import ServerSettings
from pidlease import errors
from pidlease.client.lease_client import LeaseClient, _transport_error
from pidlease.wire.tls import TLS_CA_FILE_ENV, client_ssl_context, connect_error


def test_server_needs_both_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError, match="both tls_certfile and tls_keyfile"):
        ServerSettings(tls_certfile=str(tmp_path / "c.pem"))
    with pytest.raises(ValidationError, match="both tls_certfile and tls_keyfile"):
        ServerSettings(tls_keyfile=str(tmp_path / "k.pem"))
    with pytest.raises(ValidationError, match="cannot load the TLS certificate"):
        ServerSettings(tls_certfile=str(tmp_path / "c.pem"), tls_keyfile=str(tmp_path / "k.pem"))
    s = ServerSettings()
    assert not s.tls and s.advertised_host == "" and s.advertised_port == 0


def test_coordinator_needs_both_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError, match="both tls_certfile and tls_keyfile"):
        CoordinatorSettings(tls_certfile=str(tmp_path / "c.pem"))


def test_client_context_sources(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv(TLS_CA_FILE_ENV, raising=False)
    assert client_ssl_context() is None  # plaintext
    ctx = client_ssl_context(tls=True)  # the system store
    assert isinstance(ctx, ssl.SSLContext) and ctx.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert ctx.check_hostname and ctx.verify_mode == ssl.CERT_REQUIRED
    with pytest.raises(errors.ConfigError, match="cannot load the TLS CA bundle"):
        client_ssl_context(str(tmp_path / "missing.pem"))
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    with pytest.raises(errors.ConfigError, match="cannot load the TLS CA bundle"):
        client_ssl_context(str(bad))
    monkeypatch.setenv(TLS_CA_FILE_ENV, str(tmp_path / "missing.pem"))
    with pytest.raises(errors.ConfigError, match=r"missing\.pem"):  # the env is used
        client_ssl_context()
    assert client_ssl_context(use_env=False) is None
    with pytest.raises(errors.ConfigError, match="tls must be True or False"):
        client_ssl_context(tls="yes")  # type: ignore[arg-type]


def test_certificate_failures_are_not_retriable() -> None:
    cert = ssl.SSLCertVerificationError(1, "certificate verify failed")
    cert.verify_message = "unable to get local issuer certificate"
    wrapped = httpx.ConnectError("boom")
    wrapped.__cause__ = cert
    exc = _transport_error("https://127.0.0.1:1", wrapped)
    assert isinstance(exc, errors.Unauthorized) and not exc.retriable
    assert "certificate verification" in exc.detail and "unable to get local issuer" in exc.detail
    other = _transport_error("https://127.0.0.1:1", httpx.ConnectError("refused"))
    assert isinstance(other, errors.CoordinatorUnavailable) and other.retriable
    assert isinstance(connect_error("h:1", cert), errors.Unauthorized)
    assert isinstance(
        connect_error("h:1", ssl.SSLError(1, "wrong version number")), errors.ServerUnavailable
    )
    assert isinstance(
        connect_error("h:1", ConnectionRefusedError(111, "refused")), errors.ServerUnavailable
    )


def test_https_lease_client_uses_the_given_ca(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv(TLS_CA_FILE_ENV, raising=False)
    with pytest.raises(errors.ConfigError, match="cannot load the TLS CA bundle"):
        LeaseClient("https://127.0.0.1:1", tls_ca_file=str(tmp_path / "none.pem"))
    LeaseClient("http://127.0.0.1:1", tls_ca_file=str(tmp_path / "none.pem")).close()  # not used
