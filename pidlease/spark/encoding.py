"""Rows to (key, value) bytes, as the writer sends them.

- value: the ``value`` column when there is one (binary as is, string as UTF-8; a null
  value becomes empty bytes, since a pidlease record always has a value); otherwise every
  column except the key column, as one compact JSON object per row, in column order.
- key: the ``key_column`` option's column, else a column named ``key`` when there is one,
  else no key. Binary as is, anything else as the UTF-8 of its text; null stays no key.

JSON cannot hold every Spark type directly: dates and timestamps become ISO 8601 text,
decimals their exact text, binary base64, and maps (which Arrow hands over as pairs)
objects with text keys.

The encoder is planned once from the schema (``RecordEncoder.for_columns``), so a bad
option fails on the driver before any task runs, and then applied to each Arrow batch:
``encode_columns`` gives the keys and values as Arrow binary arrays (what
``send_batch`` takes), column at a time where Arrow computes the same bytes (binary and
string columns, integer keys); ``encode`` gives them as (key, value) pairs. Both produce
the same bytes (tests/unit/spark/test_encoding.py compares them).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pidlease.spark.errors import OptionError

VALUE_COLUMN = "value"
KEY_COLUMN = "key"
_RAW_VALUE_TYPES = ("binary", "string")


def _json_default(x: Any) -> Any:
    if isinstance(x, (dt.datetime, dt.date, dt.time)):
        return x.isoformat()
    if isinstance(x, decimal.Decimal):
        return str(x)
    if isinstance(x, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(x)).decode("ascii")
    if isinstance(x, dt.timedelta):
        return x.total_seconds()
    raise TypeError(f"cannot encode {type(x).__name__} as JSON")


def _plain(x: Any) -> Any:
    """Arrow hands maps over as lists of (key, value) pairs: make them objects."""
    if isinstance(x, list):
        if x and all(isinstance(e, tuple) and len(e) == 2 for e in x):
            return {str(k): _plain(v) for k, v in x}
        return [_plain(e) for e in x]
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


def to_json(row: dict[str, Any]) -> bytes:
    return json.dumps(
        {k: _plain(v) for k, v in row.items()},
        default=_json_default,
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode()


def key_bytes(x: Any) -> bytes | None:
    if x is None:
        return None
    if isinstance(x, (bytes, bytearray, memoryview)):
        return bytes(x)
    if isinstance(x, str):
        return x.encode()
    if isinstance(x, (dt.datetime, dt.date)):
        return x.isoformat().encode()
    return str(x).encode()


def value_bytes(x: Any) -> bytes:
    if x is None:
        return b""
    if isinstance(x, (bytes, bytearray, memoryview)):
        return bytes(x)
    return str(x).encode()


@dataclass(frozen=True, slots=True)
class RecordEncoder:
    key_column: str | None
    value_column: str | None  # None: JSON of json_columns
    json_columns: tuple[str, ...]

    @classmethod
    def for_columns(
        cls, columns: Sequence[tuple[str, str]], key_column: str | None = None
    ) -> RecordEncoder:
        """Plan from (name, Spark simple type name) pairs; ``key_column`` as the option gave
        it (None: use a ``key`` column if present)."""
        names = [n for n, _ in columns]
        types = dict(columns)
        if not names:
            raise OptionError("cannot publish a DataFrame without columns")
        if key_column is not None and key_column not in types:
            raise OptionError(f"key_column {key_column!r} is not a column; columns are {names}")
        key = (
            key_column if key_column is not None else (KEY_COLUMN if KEY_COLUMN in types else None)
        )
        if VALUE_COLUMN in types and key != VALUE_COLUMN:
            if types[VALUE_COLUMN] not in _RAW_VALUE_TYPES:
                raise OptionError(
                    f"the value column must be binary or string, not "
                    f"{types[VALUE_COLUMN]}; cast it, or rename it to have the "
                    f"columns encoded as JSON"
                )
            return cls(key, VALUE_COLUMN, ())
        rest = tuple(n for n in names if n != key)
        if not rest:
            raise OptionError("there is no column left for the value besides the key column")
        return cls(key, None, rest)

    def encode(self, batch: Any) -> list[tuple[bytes | None, bytes]]:
        """(key, value) per row of a ``pyarrow.RecordBatch``."""
        keys, values = self.encode_columns(batch)
        key_list = [None] * batch.num_rows if keys is None else keys.to_pylist()
        return list(zip(key_list, values.to_pylist(), strict=True))

    def encode_columns(self, batch: Any) -> tuple[Any, Any]:
        """(keys, values) of a ``pyarrow.RecordBatch`` as Arrow binary arrays: keys None
        when there is no key column (a null key: no key), values without nulls."""
        import pyarrow as pa

        keys = None
        if self.key_column is not None:
            keys = _key_column(batch.column(self.key_column))
        if self.value_column is not None:
            col = batch.column(self.value_column)
            if col.null_count:
                col = col.fill_null(pa.scalar(b"" if _is_binary(col.type) else "", col.type))
            values = col if pa.types.is_binary(col.type) else col.cast(pa.binary())
        else:
            rows = batch.select(list(self.json_columns)).to_pylist()
            values = pa.array([to_json(r) for r in rows], pa.binary())
        return keys, values


def _is_binary(t: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t))


def _key_column(col: Any) -> Any:
    """A key column as binary, the bytes ``key_bytes`` gives: Arrow's own cast where it
    writes the same text (binary, string, integers), else row by row."""
    import pyarrow as pa

    t = col.type
    if pa.types.is_binary(t):
        return col
    if (
        pa.types.is_large_binary(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_integer(t)
    ):
        return (
            col.cast(pa.string()).cast(pa.binary())
            if pa.types.is_integer(t)
            else col.cast(pa.binary())
        )
    return pa.array([key_bytes(k) for k in col.to_pylist()], pa.binary())
