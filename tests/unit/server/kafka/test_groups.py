"""``GroupCoordinator`` (partition_server/kafka/groups.py): what it answers while a group's log
partition is loading, as Kafka's broker does (GroupCoordinator.handleHeartbeat: "the group
is still loading, so respond just blindly"): a Heartbeat is answered NONE, so the member
learns it is unknown at the next one, once loaded; a JoinGroup, SyncGroup or OffsetCommit is
answered COORDINATOR_LOAD_IN_PROGRESS and retried. aiokafka raises
COORDINATOR_LOAD_IN_PROGRESS from a heartbeat to the application (its ``getmany()``): its
consumers stopped when the group's coordinator moved
(tests/integration/test_kafka_groups_kills.py)."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kio.serial import entity_reader

from partition_server.kafka import codec as C
from partition_server.kafka.groups import GroupCoordinator
from partition_server.produce import Route
from partition_server.settings import ServerSettings
from pidlease.wire import kafka_errors as E


class Loading:
    """A group log partition led here whose log end never becomes committed."""

    def __init__(self) -> None:
        self.log = SimpleNamespace(next_offset=7, log_start_offset=0)

    def wait_durable(self, end: int) -> asyncio.Future[None]:
        return asyncio.get_running_loop().create_future()


def decode(api_key: int, version: int, frame: bytes) -> Any:
    cls = C.response_type(api_key, version)
    obj, _ = entity_reader(cls)(frame, 8 + (1 if cls.__flexible__ else 0))
    return obj


def test_a_heartbeat_while_loading_is_answered_none(tmp_path: Path) -> None:
    async def main() -> None:
        part = Loading()
        log_manager: Any = SimpleNamespace(
            produce=SimpleNamespace(route=lambda _t, _i: Route(part, 3)),  # type: ignore[arg-type]
            partitions={},
        )

        async def refresh() -> None:
            return None

        gc = GroupCoordinator(
            ServerSettings(data_dir=str(tmp_path)),
            log_manager,
            SimpleNamespace(),  # type: ignore[arg-type]
            refresh,
            stopping=lambda: False,
        )
        try:
            hb = gc.handle(
                C.Header(C.HEARTBEAT, 3, 1, "t", 0),
                SimpleNamespace(group_id="g", generation_id=4, member_id="m"),
            )
            assert isinstance(hb, bytes)
            assert int(decode(C.HEARTBEAT, 3, hb).error_code) == E.NONE
            join = gc.handle(
                C.Header(C.JOIN_GROUP, 5, 2, "t", 0),
                SimpleNamespace(
                    group_id="g",
                    session_timeout=dt.timedelta(seconds=6),
                    rebalance_timeout=dt.timedelta(seconds=6),
                    member_id="m",
                    group_instance_id=None,
                    protocol_type="consumer",
                    protocols=[],
                ),
            )
            assert isinstance(join, bytes)
            code = int(decode(C.JOIN_GROUP, 5, join).error_code)
            assert code == E.COORDINATOR_LOAD_IN_PROGRESS
        finally:
            await gc.close()

    asyncio.run(main())
