"""Test tools for the coordinator's own tests: ``FakeStore``, an in-memory stand-in for
``coordinator.store.Store`` (znodes with versions and compare-and-set like ZooKeeper's), so
the lease service and the HTTP app run without a ZooKeeper. The client-side HTTP test
client is ``pidlease.testing.http``."""

from __future__ import annotations

import threading

from coordinator.leases import record_from_bytes
from pidlease.wire import cluster
from pidlease.wire.cluster import PartitionState, PidRecord, ServerInfo, TopicSpec


class FakeStore:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.nodes: dict[str, tuple[bytes, int]] = {}
        self.writes = 0

    # generic znodes
    def _get(self, path: str) -> tuple[bytes, int] | None:
        with self.lock:
            return self.nodes.get(path)

    def _create(self, path: str, data: bytes) -> bool:
        with self.lock:
            self.writes += 1
            if path in self.nodes:
                return False
            self.nodes[path] = (data, 0)
            return True

    def _cas(self, path: str, data: bytes, version: int) -> bool:
        with self.lock:
            self.writes += 1
            cur = self.nodes.get(path)
            if cur is None or cur[1] != version:
                return False
            self.nodes[path] = (data, version + 1)
            return True

    # counter
    def read_counter(self) -> tuple[int | None, int]:
        got = self._get(cluster.PID_BLOCK)
        return (None, -1) if got is None else (int(got[0]), got[1])

    def create_counter(self, value: int) -> bool:
        return self._create(cluster.PID_BLOCK, str(value).encode())

    def cas_counter(self, value: int, version: int) -> bool:
        return self._cas(cluster.PID_BLOCK, str(value).encode(), version)

    # pids and names
    def get_pid(self, pid: int) -> tuple[PidRecord, int] | None:
        got = self._get(cluster.pid_path(pid))
        return None if got is None else (record_from_bytes(got[0]), got[1])

    def get_name(self, name: str) -> tuple[int, int] | None:
        got = self._get(cluster.name_path(name))
        return None if got is None else (int(got[0]), got[1])

    def create_pid(self, record: PidRecord) -> None:
        assert self._create(cluster.pid_path(record.pid), record.to_bytes())

    def create_named_pid(self, record: PidRecord, name: str, name_version: int | None) -> bool:
        with self.lock:
            self.writes += 1
            npath = cluster.name_path(name)
            cur = self.nodes.get(npath)
            if name_version is None and cur is not None:
                return False
            if name_version is not None and (cur is None or cur[1] != name_version):
                return False
            self.nodes[cluster.pid_path(record.pid)] = (record.to_bytes(), 0)
            self.nodes[npath] = (str(record.pid).encode(), 0 if cur is None else cur[1] + 1)
            return True

    def cas_pid(self, record: PidRecord, version: int) -> bool:
        return self._cas(cluster.pid_path(record.pid), record.to_bytes(), version)

    def list_pid_ids(self) -> list[int]:
        with self.lock:
            return sorted(int(p.split("/")[-1]) for p in self.nodes if p.startswith("/pids/"))

    def get_pids(self, pids: list[int]) -> list[tuple[PidRecord, int]]:
        return [g for g in (self.get_pid(p) for p in pids) if g is not None]

    def delete_pid(self, record: PidRecord, version: int) -> bool:
        with self.lock:
            path = cluster.pid_path(record.pid)
            if self.nodes.get(path, (b"", -1))[1] != version:
                return False
            del self.nodes[path]
            if record.producer_name:
                npath = cluster.name_path(record.producer_name)
                if self.nodes.get(npath, (b"",))[0] == str(record.pid).encode():
                    del self.nodes[npath]
            return True

    # topics and servers
    def get_topic(self, name: str) -> TopicSpec | None:
        got = self._get(cluster.topic_path(name))
        return None if got is None else TopicSpec.from_bytes(got[0])

    def get_topic_versioned(self, name: str) -> tuple[TopicSpec, int] | None:
        got = self._get(cluster.topic_path(name))
        return None if got is None else (TopicSpec.from_bytes(got[0]), got[1])

    def cas_topic(self, spec: TopicSpec, version: int) -> bool:
        return self._cas(cluster.topic_path(spec.name), spec.to_bytes(), version)

    def get_partition_states(
        self, topic: str, partitions: list[int], *, watched: bool = False
    ) -> list[PartitionState | None]:
        # ``watched``: the real store may answer from states it keeps until their znodes
        # change; this one always reads (the same answers, with no watch delay).
        out = []
        for p in partitions:
            got = self._get(cluster.partition_path(topic, p))
            out.append(None if got is None else PartitionState.from_bytes(got[0]))
        return out

    def get_servers(self, ids: list[int]) -> dict[int, ServerInfo]:
        out = {}
        for i in ids:
            got = self._get(cluster.server_path(i))
            if got is not None:
                out[i] = ServerInfo.from_bytes(got[0])
        return out

    def add_topic(self, name: str, partitions: int, leader: int = 1, dedup: str = "strict") -> None:
        spec = TopicSpec(name, partitions, dedup=dedup)
        self.nodes[cluster.topic_path(name)] = (spec.to_bytes(), 0)
        for p in range(partitions):
            self.nodes[cluster.partition_path(name, p)] = (
                PartitionState([leader], leader, 0, [leader]).to_bytes(),
                0,
            )

    def add_server(self, ident: int, port: int) -> None:
        self.nodes[cluster.server_path(ident)] = (
            ServerInfo(ident, "127.0.0.1", port).to_bytes(),
            0,
        )
