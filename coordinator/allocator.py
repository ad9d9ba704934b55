"""PID blocks for HTTP leases: the coordinator's :class:`PidAllocator` is
``pidlease.wire.pid_blocks.PidBlocks`` over its ZooKeeper store (``store.Store`` has the
counter operations). The protocol, its retry limit and why are in that module; the
partition servers' Kafka InitProducerId reserves from the same counter with the same code
(``partition_server/kafka/pids.py``)."""

from __future__ import annotations

from pidlease.wire.pid_blocks import CAS_ATTEMPTS, FIRST_PID, CounterStore, PidBlocks

__all__ = ["CAS_ATTEMPTS", "FIRST_PID", "CounterStore", "PidAllocator"]

PidAllocator = PidBlocks
