"""Rows (Arrow batches) to (key, value) bytes, and the checks made when planning."""

from __future__ import annotations

import datetime as dt
import decimal
import json

import pytest

from pidlease.spark.encoding import RecordEncoder, key_bytes, to_json
from pidlease.spark.errors import OptionError

pa = pytest.importorskip("pyarrow")


def test_value_column_is_sent_as_is_and_key_column_as_text() -> None:
    batch = pa.record_batch({"customer": [1, None, 3], "value": [b"a", None, b"\x00c"]})
    enc = RecordEncoder.for_columns([("customer", "long"), ("value", "binary")], "customer")
    assert enc.encode(batch) == [(b"1", b"a"), (None, b""), (b"3", b"\x00c")]


def test_string_value_is_utf8_and_a_key_column_is_used_by_default() -> None:
    batch = pa.record_batch({"key": ["k1", "k\u00e9"], "value": ["x", "\u00fc"]})
    enc = RecordEncoder.for_columns([("key", "string"), ("value", "string")])
    assert enc.key_column == "key"
    assert enc.encode(batch) == [(b"k1", b"x"), ("k\u00e9".encode(), "\u00fc".encode())]


def test_without_value_column_the_other_columns_become_json() -> None:
    batch = pa.record_batch({"id": [7], "customer": ["c1"], "amount": [2.5]})
    enc = RecordEncoder.for_columns(
        [("id", "long"), ("customer", "string"), ("amount", "double")], "customer"
    )
    [(key, value)] = enc.encode(batch)
    assert key == b"c1"
    assert value == b'{"id":7,"amount":2.5}'  # column order kept, key column left out


def test_json_handles_types_json_lacks() -> None:
    row = {
        "ts": dt.datetime(2024, 5, 1, 12, 30, tzinfo=dt.UTC),
        "d": dt.date(2024, 5, 1),
        "price": decimal.Decimal("10.05"),
        "raw": b"\x01\x02",
        "tags": [("a", 1), ("b", 2)],
        "nested": {"x": [1, 2]},
        "none": None,
    }
    got = json.loads(to_json(row))
    assert got == {
        "ts": "2024-05-01T12:30:00+00:00",
        "d": "2024-05-01",
        "price": "10.05",
        "raw": "AQI=",
        "tags": {"a": 1, "b": 2},
        "nested": {"x": [1, 2]},
        "none": None,
    }


def test_json_of_an_arrow_batch_with_nested_and_map_columns() -> None:
    batch = pa.record_batch(
        [pa.array([{"a": 1}]), pa.array([[("k", 2)]], pa.map_(pa.string(), pa.int64()))],
        names=["s", "m"],
    )
    enc = RecordEncoder.for_columns([("s", "struct"), ("m", "map")])
    assert enc.encode(batch) == [(None, b'{"s":{"a":1},"m":{"k":2}}')]


def test_key_bytes_of_common_types() -> None:
    assert key_bytes(None) is None
    assert key_bytes(b"x") == b"x"
    assert key_bytes(12) == b"12"
    assert key_bytes(dt.date(2024, 1, 2)) == b"2024-01-02"


@pytest.mark.parametrize(
    ("columns", "key", "match"),
    [
        ([("id", "long")], "customer", "not a column"),
        ([("value", "long")], None, "binary or string"),
        ([("key", "string")], None, "no column left"),
        ([], None, "without columns"),
    ],
)
def test_bad_plans_are_refused_with_a_reason(columns: list, key: str | None, match: str) -> None:
    with pytest.raises(OptionError, match=match):
        RecordEncoder.for_columns(columns, key)


def test_a_value_column_used_as_key_makes_the_rest_json() -> None:
    enc = RecordEncoder.for_columns([("value", "long"), ("b", "string")], "value")
    assert enc.value_column is None and enc.json_columns == ("b",)
