"""The SDK ``Consumer``'s connection settings (pidlease/client/consumer.py): the producer's
``api_token`` / ``tls_ca_file`` and their environment fallbacks, for every door (the
coordinator, the partition servers, the Kafka listener). The doors themselves are tested
on a TLS cluster with tokens in tests/integration/test_processor_default_group.py."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from pidlease import errors
from pidlease.client.consumer import Consumer

URL = "http://127.0.0.1:1"


def test_the_token_is_the_sasl_password_with_an_empty_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIDLEASE_API_TOKEN", raising=False)
    monkeypatch.delenv("PIDLEASE_TLS_CA_FILE", raising=False)
    c = Consumer(URL, ["t"], "g", api_token="s3cret")
    assert c._sasl == ("", "s3cret")  # the listener finds the principal by the token
    assert c._auth["api_token"] == "s3cret"  # and the readers and HTTP calls send it
    assert c._ssl is None  # no CA, no tls=True: plaintext, as the producer
    assert Consumer(URL, ["t"], "g")._sasl is None


def test_environment_fallbacks_as_the_producer(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PIDLEASE_API_TOKEN", "from-env")
    monkeypatch.delenv("PIDLEASE_TLS_CA_FILE", raising=False)
    assert Consumer(URL, ["t"], "g")._sasl == ("", "from-env")
    assert Consumer(URL, ["t"], "g", api_token="")._sasl is None  # explicit: none
    assert isinstance(Consumer(URL, ["t"], "g", tls=True)._ssl, ssl.SSLContext)
    bad = tmp_path / "not-a-ca.pem"
    bad.write_text("nothing here")
    with pytest.raises(errors.ConfigError, match="CA bundle"):
        Consumer(URL, ["t"], "g", tls_ca_file=str(bad))
    monkeypatch.setenv("PIDLEASE_TLS_CA_FILE", str(bad))
    with pytest.raises(errors.ConfigError, match="CA bundle"):
        Consumer(URL, ["t"], "g")
