"""The ``pidlease`` Python data source: the one class Spark knows, which hands out the
scan (``pidlease.spark.scan``), the stream's reader (``pidlease.spark.stream_source``) and the sinks
(``pidlease.spark.sink``)."""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from pidlease.spark.options import ReadSettings
from pidlease.spark.scan import SCHEMA_DDL, Scan
from pidlease.spark.sink import BatchSink, StreamSink

FORMAT = "pidlease"


class PidleaseDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return Scan(ReadSettings.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        # Imported here: it needs pyspark.sql.streaming.datasource (PySpark >= 4.2), the
        # batch source and the sinks do not.
        from pidlease.spark.stream_source import StreamReadSettings, StreamScan

        return StreamScan(StreamReadSettings.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return BatchSink.plan(self.options, schema, overwrite)

    def streamWriter(  # noqa: N802 - PySpark's DataSource method name
        self, schema: StructType, overwrite: bool
    ) -> DataSourceStreamWriter:
        # Older pyspark releases (>=4.1 is allowed) did not type StreamSink's base as a
        # DataSourceStreamWriter; the one installed here does, hence unused-ignore.
        return StreamSink.plan(self.options, schema, overwrite)  # type: ignore[return-value, unused-ignore]


def register(spark: Any) -> None:
    """Make ``format("pidlease")`` available in this Spark session."""
    spark.dataSource.register(PidleaseDataSource)
