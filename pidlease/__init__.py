"""pidlease: exactly-once publishing with leased producer ids.

The public surface is this module's names::

    from pidlease import Producer, AsyncProducer, Reader, Consumer, RecordMetadata, Record, errors
    from pidlease import Processor, AsyncProcessor  # consume-transform-produce

How the package is built (read this first; each subpackage's ``__init__`` lists its modules):

- ``errors``    the error tree and wire codes, shared by the SDK and the servers
- ``client``    the SDK: producers, the send pipeline, leases, connections, the reader
- ``wire``      what the SDK and the servers share: framing, messages and the batch format,
                lease tokens, the ZooKeeper layout, TLS
- ``testing``   public test tools: a real local cluster, a ZooKeeper runner, a fault proxy
- ``cli``       the ``pidlease`` command, the demo and the exactly-once audit

The servers live beside this package (``coordinator``, ``partition_server``) and import
only ``pidlease.wire`` and ``pidlease.errors``. The Spark data source is ``pidlease.spark``
(``register``, ``bucketed``, the ``pidlease-spark`` command); nothing here imports it.

Names are imported lazily at run time, so a server importing ``pidlease.wire.protocol``
does not pay for the SDK's imports; a type checker sees the real classes (the imports
under ``TYPE_CHECKING`` below).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pidlease import errors
    from pidlease.client.consumer import Consumer
    from pidlease.client.processor import AsyncProcessor, Processor
    from pidlease.client.producer import AsyncProducer, Producer
    from pidlease.client.reader import Reader
    from pidlease.client.structs import RecordMetadata
    from pidlease.wire.protocol import Record

__all__ = [
    "Producer",
    "AsyncProducer",
    "Reader",
    "Consumer",
    "Processor",
    "AsyncProcessor",
    "RecordMetadata",
    "Record",
    "errors",
]
__version__ = "0.1.0"

_LAZY = {
    "Producer": "pidlease.client.producer",
    "AsyncProducer": "pidlease.client.producer",
    "RecordMetadata": "pidlease.client.structs",
    "Reader": "pidlease.client.reader",
    "Consumer": "pidlease.client.consumer",
    "Processor": "pidlease.client.processor",
    "AsyncProcessor": "pidlease.client.processor",
    "Record": "pidlease.wire.protocol",
    "errors": "pidlease.errors",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'pidlease' has no attribute {name!r}")
    module = importlib.import_module(mod)
    value = module if name == "errors" else getattr(module, name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
