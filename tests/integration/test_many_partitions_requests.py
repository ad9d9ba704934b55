"""PRODUCER_STATES and FENCES on a real partition server (issue 24): one request for one PID
on many partitions, each partition answered as PRODUCER_STATE / FENCE would answer it, and
bad input refused with a clear error while the connection keeps serving."""

from __future__ import annotations

import struct

import pytest

from pidlease import errors
from pidlease.testing.devcluster import DEV_SECRET
from pidlease.testing.wire import WireClient, batch, create_topic, token
from pidlease.wire import protocol as P

ENV = {"PIDLEASE_FSYNC_INTERVAL_MS": "1"}
CREATE = P.FENCE_CREATE_IF_ABSENT


@pytest.fixture
def server(make_cluster):  # type: ignore[no-untyped-def]
    cluster = make_cluster(servers=1, coordinators=0, env=ENV)
    return cluster.servers[0]


def test_states_and_fences_for_many_partitions_answer_each_partition(server, zk_hosts) -> None:
    create_topic(zk_hosts, "m", 4)
    pid, gen = 41, 5
    old = token(DEV_SECRET, pid, gen)
    with WireClient(server.address) as c:
        assert c.produce("m", 0, batch(pid, gen, 0, [b"a", b"b"]), old).error_code == 0
        assert c.produce("m", 1, batch(pid, gen, 0, [b"a"]), old).error_code == 0
        asked = [("m", 0), ("m", 1), ("m", 2), ("m", 9), ("nope", 0)]
        r = c.producer_states(pid, asked)
        assert r.error_code == 0 and r.entries is not None
        got = [(e.error_code, e.found, e.generation, e.durable_highwater) for e in r.entries]
        unknown = errors.UnknownTopicOrPartition.code
        assert got == [
            (0, True, gen, 1),
            (0, True, gen, 0),
            (0, False, 0, -1),
            (unknown, False, 0, -1),
            (unknown, False, 0, -1),
        ]
        assert "no partition m/9" in r.entries[3].detail

        new = token(DEV_SECRET, pid, gen + 1)
        entries = [
            P.PartitionEntry("m", 0, 0, 0),
            P.PartitionEntry("m", 1, 0, 0),
            P.PartitionEntry("m", 2, CREATE, 0),
            P.PartitionEntry("m", 3, 0, 0),  # no state, may not create: nothing written
            P.PartitionEntry("m", 9, CREATE, 0),
        ]
        f = c.fences(pid, gen + 1, new, entries)
        assert f.error_code == 0 and f.entries is not None
        got = [(e.error_code, e.existed, e.durable_highwater) for e in f.entries]
        assert got == [
            (0, True, 1),
            (0, True, 0),
            (0, False, -1),
            (0, False, -1),
            (unknown, False, -1),
        ]
        assert f.entries[2].fence_offset >= 0, "m/2: a fresh entry was written"
        assert f.entries[3].fence_offset == -1, "m/3: nothing written"
        # Every fenced partition refuses the old generation, as after a FENCE each.
        for p in (0, 1, 2):
            r1 = c.produce("m", p, batch(pid, gen, 5, [b"late"]), old)
            assert r1.error_code == errors.ProducerFenced.code, p
            assert c.producer_state("m", p, pid).generation == gen + 1
        # Fencing again at the same generation writes nothing; an older one is FENCED.
        again = c.fences(pid, gen + 1, new, entries[:3])
        assert [e.fence_offset for e in again.entries or []] == [-1, -1, -1]
        older = c.fences(pid, gen, old, entries[:2])
        assert [e.error_code for e in older.entries or []] == [errors.ProducerFenced.code] * 2


def test_bad_many_partition_requests_get_clear_errors(server, zk_hosts) -> None:
    create_topic(zk_hosts, "b", 2)
    pid, gen = 77, 3
    tok = token(DEV_SECRET, pid, gen)
    one = [P.PartitionEntry("b", 0, CREATE, 0)]
    with WireClient(server.address) as c:
        # A token for another generation: the whole request is refused, nothing fenced.
        r = c.fences(pid, gen, token(DEV_SECRET, pid, gen + 1), one)
        assert r.error_code == errors.Unauthorized.code and r.entries == []
        assert c.producer_state("b", 0, pid).found is False
        r = c.fences(pid, gen, tok, [P.PartitionEntry("b", 0, 0x80, 0)])
        assert (r.error_code, r.entries) == (errors.InvalidRequest.code, [])
        assert "unknown fence flags 0x80" in r.detail
        r = c.fences(0, gen, tok, one)
        assert r.error_code == errors.InvalidRequest.code and "pid" in r.detail

        def raw(api: int, count: int, entry: bytes) -> P.Response:
            corr = c.next_corr()
            body = struct.pack(">BIQ", api, corr, pid)
            if api == P.FENCES:
                body += struct.pack(">I", gen) + P.pack_str(tok)
            c.send(api, P.frame(body + struct.pack(">I", count) + entry * count), corr)
            return c.recv()

        state_entry = P.pack_str("b") + struct.pack(">I", 0)
        fence_entry = state_entry + struct.pack(">Bq", 0, 0)
        for api, entry in ((P.PRODUCER_STATES, state_entry), (P.FENCES, fence_entry)):
            huge = raw(api, P.PARTITIONS_PER_REQUEST_MAX + 1, entry)
            assert huge.error_code == errors.InvalidRequest.code
            assert "over the limit of 10000" in huge.detail
            twice = raw(api, 2, entry)
            assert (twice.error_code, twice.entries) == (errors.InvalidRequest.code, [])
            assert "named twice" in twice.detail
            none = raw(api, 0, b"")
            assert none.error_code == errors.InvalidRequest.code and "names none" in none.detail
            short = c.next_corr()
            c.send(api, P.frame(struct.pack(">BIQ", api, short, pid) + b"\x00"), short)
            assert c.recv().error_code == errors.CorruptRecord.code
        # The connection still serves.
        ok = c.producer_states(pid, [("b", 0), ("b", 1)])
        assert ok.error_code == 0 and [e.found for e in ok.entries or []] == [False, False]
