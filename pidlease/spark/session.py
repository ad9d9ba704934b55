"""The Spark session ``pidlease-spark`` (and the tests and the benchmark) run on.

Defaults keep Spark on loopback and quiet: the driver binds and advertises 127.0.0.1,
no web UI, no console progress bar (``pidlease.spark.progress`` reports instead), and Python
workers run the same interpreter as the driver (``PYSPARK_PYTHON``), so they import the
same pidlease. ``local[*]`` by default; ``local[N,F]`` retries a failed task up to F-1
times (plain ``local[N]`` never retries); ``spark://host:port`` for a standalone cluster,
whose executors need pidlease installed and must reach the coordinator and servers.
Any ``conf`` given overrides these defaults (``--conf key=value`` on the command line).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

LOOPBACK = "127.0.0.1"

DEFAULT_CONF: dict[str, str] = {
    "spark.driver.bindAddress": LOOPBACK,
    "spark.driver.host": LOOPBACK,
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.session.timeZone": "UTC",
}


def spark_environment() -> None:
    """Environment the JVM and its Python workers inherit; set before the JVM starts."""
    os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def build_session(
    master: str = "local[*]",
    *,
    app_name: str = "pidlease-spark",
    conf: Mapping[str, str] | None = None,
    log_level: str = "WARN",
) -> Any:
    """A SparkSession with the pidlease data source registered."""
    spark_environment()
    from pyspark.sql import SparkSession

    from pidlease.spark.source import register  # imports pyspark: only here

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**DEFAULT_CONF, **dict(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    register(spark)
    return spark


def parse_conf(pairs: list[str] | None) -> dict[str, str]:
    """``["k=v", ...]`` from the command line."""
    out: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--conf wants key=value, not {pair!r}")
        out[key.strip()] = value
    return out
