"""The registry reads a topic's partition states in one pipelined round (kazoo
``get_async``; issue 24) on a real ZooKeeper: every state comes back, a partition whose
znode is gone between the listing and the read is skipped, and a change to one state
fires the watch the pipelined read left on it."""

from __future__ import annotations

import asyncio
from typing import Any

from partition_server.registry import Assignment, Registry
from pidlease.wire import cluster as layout
from pidlease.wire.cluster import PartitionState, TopicSpec, connect_zk
from tests.helpers import wait_until

N = 400


def test_pipelined_read_of_many_partition_states(zk_hosts: str) -> None:
    zk = connect_zk(zk_hosts)
    try:
        zk.create(layout.topic_path("many"), TopicSpec("many", N).to_bytes())
        zk.create(layout.topic_path("many") + "/partitions", b"")
        tx = None
        for p in range(N):
            if tx is None:
                tx = zk.transaction()
            tx.create(
                layout.partition_path("many", p),
                PartitionState([1, 2, 3], 1 + p % 3, p, [1, 2, 3]).to_bytes(),
            )
            if p % 100 == 99:
                assert all(isinstance(r, str) for r in tx.commit())
                tx = None

        async def go() -> None:
            reg = Registry(zk_hosts, 7)
            seen: list[Assignment] = []
            reg.on_change = seen.append
            await asyncio.get_running_loop().run_in_executor(None, reg.connect)
            one_by_one: list[str] = []
            sync_get = reg.zk.get

            def counting_get(path: str, *args: Any, **kw: Any) -> Any:
                if "/partitions/" in path:
                    one_by_one.append(path)
                return sync_get(path, *args, **kw)

            reg.zk.get = counting_get
            try:
                a = await asyncio.wait_for(reg.refresh(), 30)
                assert one_by_one == [], "partition states read one round trip each"
                got = {k: v for k, v in a.partitions.items() if k[0] == "many"}
                assert len(got) == N
                assert all(got[("many", p)].leader_epoch == p for p in range(N))
                assert got[("many", 5)].leader == 1 + 5 % 3
                # A state change fires the watch the pipelined read armed.
                zk.set(
                    layout.partition_path("many", 321),
                    PartitionState([1, 2, 3], 2, 1000, [2, 3]).to_bytes(),
                )
                await wait_until(
                    lambda: seen[-1].partitions[("many", 321)].leader_epoch == 1000, 10
                )
                # A partition znode that is gone is left out, the others are read.
                zk.delete(layout.partition_path("many", 7))
                b = await asyncio.wait_for(reg.refresh(), 30)
                assert ("many", 7) not in b.partitions
                assert sum(1 for k in b.partitions if k[0] == "many") == N - 1
            finally:
                reg.close()

        asyncio.run(go())
    finally:
        zk.stop()
        zk.close()
