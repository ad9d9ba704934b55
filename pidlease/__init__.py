"""pidlease: exactly-once publishing with leased producer ids.

How the package is built (read this first):

- ``errors``     the error tree and wire codes shared by SDK and servers
- ``protocol``   the binary protocol and the batch format (what is on disk is what was sent)
- ``token``      lease tokens, HMAC-signed by the coordinator, checked by partition servers
- ``cluster``    the ZooKeeper layout the coordinator and partition servers share
- ``producer`` / ``reader``   the SDK: ``AsyncProducer`` does the work on an asyncio loop;
                 ``Producer`` runs one on a background thread; ``Reader`` fetches a partition
- ``zkserver`` / ``devcluster``   a real local cluster of processes, for dev, demo and tests
- ``cli``        the ``pidlease`` command

Names are imported lazily so that servers importing ``pidlease.protocol`` do not pay for
the SDK's imports.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Producer", "AsyncProducer", "Reader", "RecordMetadata", "Record", "errors"]
__version__ = "0.1.0"

_LAZY = {
    "Producer": "pidlease.producer",
    "AsyncProducer": "pidlease.producer",
    "RecordMetadata": "pidlease.producer",
    "Reader": "pidlease.reader",
    "Record": "pidlease.protocol",
    "errors": "pidlease.errors",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'pidlease' has no attribute {name!r}")
    module = importlib.import_module(mod)
    return module if name == "errors" else getattr(module, name)
