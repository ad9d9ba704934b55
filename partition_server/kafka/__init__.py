"""The Kafka protocol listener of a partition server (docs/kafka.md): unmodified Kafka
clients produce to and fetch from the same partitions as the pidlease SDK.

- ``codec``: the one adapter over ``kio`` (Kafka's message schemas), and the table of the
  APIs and versions we advertise;
- ``listener``: connections, framing, the SASL gate, answers in request order;
- ``apis``: ApiVersions, Metadata, InitProducerId, CreateTopics and SASL, over the
  ZooKeeper registry, and the dispatch to ``records``;
- ``records``: Produce, Fetch and ListOffsets over the partitions this server leads;
- (Kafka error codes: ``pidlease.wire.kafka_errors``, the one table);
- ``pids``: InitProducerId's PIDs, from the cluster's ZooKeeper PID counter, and who owns them;
- ``topics``: CreateTopics, written to ZooKeeper as the coordinator writes a topic;
- ``sasl``: SASL/PLAIN against the same API tokens as the coordinator.

The log side (RecordBatch v2 validation, Kafka's idempotence rules, Fetch assembly) is
``partition_server/kafka_partition.py``.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable

from partition_server.kafka.apis import KafkaApis
from partition_server.kafka.listener import KafkaListener
from partition_server.kafka.pids import KafkaPids
from partition_server.kafka.sasl import load_principals
from partition_server.log_manager import LogManager
from partition_server.registry import Registry
from partition_server.settings import ServerSettings
from pidlease.wire.tls import server_ssl_context

__all__ = ["KafkaListener", "make_listener"]


def make_listener(
    settings: ServerSettings,
    log_manager: LogManager,
    registry: Registry,
    stopping: Callable[[], bool],
) -> KafkaListener:
    """The listener of this server's settings: TLS when the server has TLS, SASL when
    API tokens are configured."""
    principals = load_principals(settings.api_token, settings.api_tokens, settings.api_tokens_file)
    pids: list[KafkaPids] = []

    def get_pids() -> KafkaPids:
        # Made on first use: the registry's ZooKeeper client exists only once started.
        if not pids:
            pids.append(KafkaPids(registry.zk, settings.kafka_pid_block_size))
        return pids[0]

    apis = KafkaApis(settings, log_manager, registry, get_pids, principals, stopping=stopping)
    ctx: ssl.SSLContext | None = (
        server_ssl_context(settings.tls_certfile, settings.tls_keyfile) if settings.tls else None
    )
    return KafkaListener(
        apis,
        frame_bytes_max=settings.frame_bytes_max,
        inflight_max=settings.inflight_requests_max_per_connection,
        ssl_context=ctx,
    )
