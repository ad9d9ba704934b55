"""The producer's settings: keyword-only, typed, one default each, checked before use."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from pidlease import errors
from pidlease.client.producer import AsyncProducer, Producer, ProducerConfig

# tests/unit/conftest.py: each test of this module runs on the fast and the readable path
SDK_BOTH_PATHS = True


def _params(cls: type[AsyncProducer] | type[Producer]) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(cls.__init__).parameters)


def test_the_two_producers_take_the_same_settings() -> None:
    a, b = _params(AsyncProducer), _params(Producer)
    assert list(a) == list(b)
    for name, pa in a.items():
        pb = b[name]
        assert (pa.kind, pa.default, pa.annotation) == (pb.kind, pb.default, pb.annotation), name


def test_settings_are_keyword_only_with_the_configs_defaults() -> None:
    params = _params(Producer)
    positional = [n for n, p in params.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == ["self", "coordinator_url", "topic"]
    assert not any(p.kind is p.VAR_KEYWORD for p in params.values())  # no **settings: Any
    for f in dataclasses.fields(ProducerConfig):
        p = params[f.name]
        assert p.kind is p.KEYWORD_ONLY and p.default == f.default, f.name
    contract = {
        "producer_name": None,
        "expire_ms": None,
        "max_in_flight": 5,
        "linger_ms": 5,
        "delivery_timeout_ms": None,
    }
    assert {n: params[n].default for n in contract} == contract


def test_a_setting_passed_by_position_or_misspelt_is_refused_by_python() -> None:
    with pytest.raises(TypeError):
        Producer("http://127.0.0.1:1", "t", "name")  # type: ignore[misc]
    with pytest.raises(TypeError, match="linger"):
        Producer("http://127.0.0.1:1", "t", lingerms=5)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    "setting",
    [
        {"max_in_flight": "5"},
        {"linger_ms": None},
        {"batch_records_max": True},
        {"retry_backoff_ms": 2000},
        {"delivery_timeout_ms": 0},
    ],
)
def test_a_bad_value_is_a_config_error(setting: dict[str, object]) -> None:
    with pytest.raises(errors.ConfigError, match="producer setting"):
        AsyncProducer("http://127.0.0.1:1", "t", **setting)  # type: ignore[arg-type]
