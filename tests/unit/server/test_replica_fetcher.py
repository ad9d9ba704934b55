"""``ReplicaFetcher`` and ``FetchSessions`` (partition_server/replica_fetcher.py): a
follower's fetches from a fake leader on a loopback socket: the quick retries of a leader
not leading yet, and the fetch session (every partition on one leader in one request)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

from partition_server import replica_fetcher
from partition_server.flusher import Flusher
from partition_server.partition import Partition
from partition_server.replica_fetcher import FetchSessions, ReplicaFetcher
from partition_server.testing import open_part, settle
from pidlease import errors
from pidlease.wire import protocol as P
from pidlease.wire.framing import read_frame


class NotYetLeader:
    """A leader that answers every request NOT_LEADER (each partition of a
    REPLICA_FETCH_MANY), counting connections and requests."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                req = P.decode_request(await read_frame(reader, 1 << 20))
                self.requests += 1
                writer.write(self._answer(req))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @staticmethod
    def _answer(req: P.Request) -> bytes:
        code, why, corr = errors.NotLeader.code, "not leading yet", req.correlation_id
        if req.api_key == P.EPOCH_END:
            return P.epoch_end_response(corr, code, why)
        if req.api_key == P.REPLICA_FETCH_MANY:
            return P.replica_fetch_many_response(
                corr,
                0,
                "",
                [P.ReplicaFetched(e.topic, e.partition, code, why) for e in req.fetches or []],
            )
        return P.replica_fetch_response(corr, code, why)


def fetcher_settings(backoff_ms: float) -> SimpleNamespace:
    return SimpleNamespace(
        replica_fetch_backoff_ms=backoff_ms,
        replica_fetch_timeout_ms=5_000,
        replica_fetch_wait_max_ms=0,
        fetch_bytes_max=1 << 20,
        frame_bytes_max=1 << 21,
    )


def test_a_follower_asks_a_not_yet_leader_again_quickly_a_bounded_number_of_times(
    tmp_path: Path,
) -> None:
    """Issue 16 (the tail of a failover, at most 2 s after a SIGKILL of the leader): a follower
    answered NOT_LEADER by the leader ZooKeeper names asks again at once, a bounded number
    of times, instead of waiting out its backoff."""

    async def go() -> None:
        part = open_part(tmp_path, Flusher(mode="batch", interval_ms=0))
        leader = NotYetLeader()
        address = await leader.start()
        troubles: list[float] = []
        gave_up = asyncio.Event()

        def trouble() -> None:
            troubles.append(time.monotonic())
            gave_up.set()

        f = ReplicaFetcher(
            part,
            me=1,
            leader=2,
            epoch=5,
            address=address,
            settings=fetcher_settings(backoff_ms=2_000),  # a backoff would show as 2 s
            on_trouble=trouble,
        )
        f.start()
        await asyncio.wait_for(gave_up.wait(), 20)
        # The first answer and the bounded quick retries, then one ZooKeeper re-read and
        # the usual backoff (2 s here: nothing more for a while).
        assert troubles, "the fetcher never gave up the quick retries"
        # Asked again on the same connection (the fetch session to that server goes on;
        # only this partition's part of it starts over).
        assert leader.requests > 1, "not asked again before the backoff"
        assert leader.requests == 1 + replica_fetcher.NOT_YET_LEADER_RETRIES
        await asyncio.sleep(0.3)
        assert leader.requests == 1 + replica_fetcher.NOT_YET_LEADER_RETRIES
        assert leader.connections == 1
        assert len(troubles) == 1
        assert "NotLeader" in f.last_error
        f.stop()
        assert leader.server is not None
        leader.server.close()
        await settle()
        part.close()

    asyncio.run(go())


def test_a_leader_that_answered_before_gets_the_usual_backoff(tmp_path: Path) -> None:
    """Issue 16 (the tail of a failover, at most 2 s after a SIGKILL of the leader): only a
    leader that never answered yet is asked again at once; one that answered before gets the
    usual backoff."""

    async def go() -> None:
        part = open_part(tmp_path, Flusher(mode="batch", interval_ms=0))
        leader = NotYetLeader()
        address = await leader.start()
        troubles: list[float] = []
        gave_up = asyncio.Event()

        def trouble() -> None:
            troubles.append(time.monotonic())
            gave_up.set()

        f = ReplicaFetcher(
            part,
            me=1,
            leader=2,
            epoch=5,
            address=address,
            settings=fetcher_settings(backoff_ms=2_000),
            on_trouble=trouble,
        )
        f.fetches_answered = 1  # it led this epoch and answered: now deposed, not late
        f.start()
        await asyncio.wait_for(gave_up.wait(), 20)
        await asyncio.sleep(0.3)
        assert leader.requests == 1 and len(troubles) == 1
        f.stop()
        assert leader.server is not None
        leader.server.close()
        await settle()
        part.close()

    asyncio.run(go())


# -- a follower's fetch session (issue 24 item 2)
WAIT_MS = 2_000  # how long the fake leader holds a fetch with nothing new


class IdleLeader:
    """Answers EPOCH_END with "your epoch ends where you are", holds each
    REPLICA_FETCH_MANY for its wait then answers nothing new (NOT_LEADER for the
    partitions in ``refuse``), recording who asked for what."""

    def __init__(self) -> None:
        self.connections = 0
        self.fetches: list[tuple[float, list[tuple[str, int]]]] = []
        self.refuse: set[tuple[str, int]] = set()
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                req = P.decode_request(await read_frame(reader, 1 << 20))
                corr = req.correlation_id
                if req.api_key == P.EPOCH_END:
                    writer.write(P.epoch_end_response(corr, 0, epoch=req.epoch, end_offset=0))
                else:
                    assert req.api_key == P.REPLICA_FETCH_MANY
                    keys = [(e.topic, e.partition) for e in req.fetches or []]
                    self.fetches.append((time.monotonic(), keys))
                    bad = [k for k in keys if k in self.refuse]
                    if not bad:
                        await asyncio.sleep(req.max_wait_ms / 1000)
                    writer.write(
                        P.replica_fetch_many_response(
                            corr,
                            0,
                            "",
                            [P.ReplicaFetched(t, p, errors.NotLeader.code, "no") for t, p in bad],
                        )
                    )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def until(pred: Callable[[], bool], timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if pred():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not reached in time")


def settings() -> SimpleNamespace:
    return SimpleNamespace(
        replica_fetch_backoff_ms=10_000,  # a partition's backoff would show as 10 s
        replica_fetch_timeout_ms=5_000,
        replica_fetch_wait_max_ms=WAIT_MS,
        fetch_bytes_max=1 << 20,
        frame_bytes_max=1 << 21,
    )


def fetcher(
    part: Partition, address: str, pool: FetchSessions, troubles: list[int]
) -> ReplicaFetcher:
    return ReplicaFetcher(
        part,
        me=1,
        leader=2,
        epoch=0,
        address=address,
        settings=settings(),
        on_trouble=lambda: troubles.append(part.partition),
        pool=pool,
    )


def test_partitions_on_one_leader_share_one_connection_and_one_fetch(tmp_path: Path) -> None:
    """Issue 24 item 2 (fetch sessions): every partition a follower follows on one leader
    server goes over one connection, one REPLICA_FETCH_MANY per round naming them all."""

    async def go() -> None:
        leader = IdleLeader()
        address = await leader.start()
        flusher = Flusher(mode="batch", interval_ms=0)
        parts = [open_part(tmp_path / str(i), flusher, partition=i) for i in range(3)]
        pool = FetchSessions()
        troubles: list[int] = []
        fs = [fetcher(p, address, pool, troubles) for p in parts]
        for f in fs:
            f.start()
        await until(lambda: bool(leader.fetches))
        assert leader.connections == 1
        assert sorted(leader.fetches[0][1]) == [("t", 0), ("t", 1), ("t", 2)]
        # A fourth partition joins while that fetch is parked (2 s): it is fetched at
        # once, on a new connection, with the others.
        late = open_part(tmp_path / "3", flusher, partition=3)
        joined = time.monotonic()
        f4 = fetcher(late, address, pool, troubles)
        f4.start()
        await until(lambda: len(leader.fetches) >= 2)
        at, keys = leader.fetches[1]
        assert at - joined < WAIT_MS / 1000 / 2, "the new partition waited for the parked fetch"
        assert ("t", 3) in keys and len(keys) == 4
        assert leader.connections == 2
        # One partition refused (deposed leader): it backs off alone; the others go on.
        leader.refuse.add(("t", 1))
        n = len(leader.fetches)
        await until(lambda: len(leader.fetches) >= n + 3)
        later = leader.fetches[-1][1]
        assert ("t", 1) not in later and len(later) == 3
        assert troubles == [1] and "NotLeader" in fs[1].last_error
        assert leader.connections == 2  # the session went on
        for f in [*fs, f4]:
            f.stop()
        assert not pool.sessions
        assert leader.server is not None
        leader.server.close()
        await settle()
        for p in [*parts, late]:
            p.close()

    asyncio.run(go())
