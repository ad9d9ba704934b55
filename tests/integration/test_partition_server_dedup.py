"""Append rules end to end over real sockets: duplicates, fencing, tokens, expiry of
unknown PIDs, dedup modes, and DUPLICATE offsets surviving a SIGKILL + restart."""

from __future__ import annotations

import pytest

from pidlease import errors
from pidlease.testing.devcluster import DEV_SECRET
from pidlease.testing.wire import WireClient, batch, create_topic, token

ENV = {"PIDLEASE_FSYNC_INTERVAL_MS": "1"}


@pytest.fixture
def server(make_cluster):  # type: ignore[no-untyped-def]
    cluster = make_cluster(servers=1, coordinators=0, env=ENV)
    return cluster, cluster.servers[0]


def test_duplicate_answers_original_offsets_for_last_k_batches_after_sigkill(
    server, zk_hosts
) -> None:
    cluster, svc = server
    create_topic(zk_hosts, "d")
    pid, gen = 41, 5
    tok = token(DEV_SECRET, pid, gen)
    sent = [batch(pid, gen, i * 3, [b"a%d" % i, b"b", b"c"]) for i in range(8)]
    with WireClient(svc.address) as c:
        first = [c.produce("d", 0, b, tok) for b in sent]
    assert [r.error_code for r in first] == [0] * 8
    offsets = [(r.base_offset, r.last_offset) for r in first]

    for round_ in ("live", "after SIGKILL"):
        if round_ == "after SIGKILL":
            cluster.kill(svc)
            cluster.start_service(svc)
        with WireClient(svc.address) as c:
            again = [c.produce("d", 0, b, tok) for b in sent]
            # the last K=5 batches: original offsets; older ones: -1
            for i, r in enumerate(again):
                assert r.error_code == errors.DUPLICATE, (round_, i, r)
                want = offsets[i] if i >= 3 else (-1, -1)
                assert (r.base_offset, r.last_offset) == want, (round_, i)
            recs = c.read_all("d", 0)
            assert [r.sequence_id for r in recs] == list(range(24)), round_
    with WireClient(svc.address) as c:
        nxt = c.produce("d", 0, batch(pid, gen, 24, [b"n"]), tok)
        assert (nxt.error_code, nxt.base_offset) == (0, 24)


def test_sequence_rules_over_the_wire(server, zk_hosts) -> None:
    _, svc = server
    create_topic(zk_hosts, "s")
    tok = token(DEV_SECRET, 9, 1)
    with WireClient(svc.address) as c:
        r = c.produce("s", 0, batch(9, 1, 5, [b"x"]), tok)
        assert r.error_code == errors.UnknownPid.code
        assert c.produce("s", 0, batch(9, 1, 0, [b"x", b"y"]), tok).error_code == 0
        r = c.produce("s", 0, batch(9, 1, 4, [b"z"]), tok)
        assert (r.error_code, r.expected_sequence) == (errors.OutOfOrderSequence.code, 2)
        r = c.produce("s", 0, batch(9, 1, 1, [b"y", b"z"]), tok)  # straddles H
        assert (r.error_code, r.expected_sequence) == (errors.OutOfOrderSequence.code, 2)
        r = c.produce("s", 0, batch(9, 1, 1, [b"y"]), tok)  # subset of a known batch
        assert (r.error_code, r.base_offset) == (errors.DUPLICATE, -1)
        st = c.producer_state("s", 0, 9)
        assert (st.found, st.generation, st.durable_highwater) == (True, 1, 1)
        assert len(c.read_all("s", 0)) == 2


def test_tokens_are_checked_for_idempotent_appends(server, zk_hosts) -> None:
    _, svc = server
    create_topic(zk_hosts, "u")
    with WireClient(svc.address) as c:
        b = batch(3, 2, 0, [b"x"])
        for tok in (
            "",
            "garbage",
            token("other-secret", 3, 2),
            token(DEV_SECRET, 4, 2),
            token(DEV_SECRET, 3, 1),
            token(DEV_SECRET, 3, 2, ttl_ms=-1),
        ):
            assert c.produce("u", 0, b, tok).error_code == errors.Unauthorized.code, tok
        assert c.produce("u", 0, batch(0, 0, 0, [b"pid0"])).error_code == 0
        assert c.produce("u", 0, b, token(DEV_SECRET, 3, 2)).error_code == 0
        assert c.fence("u", 0, 3, 9, token(DEV_SECRET, 3, 8)).error_code == errors.Unauthorized.code
        assert [r.value for r in c.read_all("u", 0)] == [b"pid0", b"x"]


def test_fence_blocks_the_zombie(server, zk_hosts) -> None:
    cluster, svc = server
    create_topic(zk_hosts, "f")
    pid = 77
    old, new = token(DEV_SECRET, pid, 10), token(DEV_SECRET, pid, 11)
    with WireClient(svc.address) as c:
        assert c.produce("f", 0, batch(pid, 10, 0, [b"a", b"b"]), old).error_code == 0
        r = c.fence("f", 0, pid, 11, new)
        assert r.error_code == 0 and r.existed and r.durable_highwater == 1 and r.fence_offset == 2
        again = c.fence("f", 0, pid, 11, new)  # idempotent: nothing written
        assert again.error_code == 0 and again.fence_offset == -1
        z = c.produce("f", 0, batch(pid, 10, 2, [b"zombie"]), old)
        assert z.error_code == errors.ProducerFenced.code
        assert c.fence("f", 0, pid, 10, old).error_code == errors.ProducerFenced.code
        assert c.produce("f", 0, batch(pid, 11, 2, [b"c"]), new).error_code == 0
        # a fence on a partition the PID never wrote: created, so its zombie's first
        # append (base 0, old generation) is refused too
        r = c.fence("f", 0, 500, 4, token(DEV_SECRET, 500, 4), create_if_absent=True)
        assert r.error_code == 0 and not r.existed and r.durable_highwater == -1
        assert (
            c.produce("f", 0, batch(500, 3, 0, [b"z"]), token(DEV_SECRET, 500, 3)).error_code
            == errors.ProducerFenced.code
        )
        r = c.fence("f", 0, 501, 4, token(DEV_SECRET, 501, 4), create_if_absent=False)
        assert r.error_code == 0 and not r.existed and r.fence_offset == -1
        assert not c.producer_state("f", 0, 501).found
    cluster.kill(svc)
    cluster.start_service(svc)
    with WireClient(svc.address) as c:
        assert (
            c.produce("f", 0, batch(pid, 10, 3, [b"zombie"]), old).error_code
            == errors.ProducerFenced.code
        )
        st = c.producer_state("f", 0, pid)
        assert (st.generation, st.durable_highwater) == (11, 2)
        recs = c.read_all("f", 0)
        assert [(r.value, r.is_control) for r in recs] == [
            (b"a", False),
            (b"b", False),
            (b"", True),
            (b"c", False),
            (b"", True),
        ]
        assert [r.generation for r in recs] == [10, 10, 11, 11, 4]


@pytest.mark.parametrize("mode", ["monotonic", "off"])
def test_dedup_modes(server, zk_hosts, mode: str) -> None:
    _, svc = server
    create_topic(zk_hosts, "m", dedup=mode)
    tok = token(DEV_SECRET, 5, 0)
    with WireClient(svc.address) as c:
        codes = [
            c.produce("m", 0, batch(5, 0, s, [b"%d" % s]), tok).error_code
            for s in (10, 20, 15, 20, 30)
        ]
    if mode == "monotonic":
        # 15 is below the highwater but was never written (between the kept batches 10 and
        # 20): not a DUPLICATE ("a refusal leaves no hole", docs/protocol.md), and never appendable
        assert codes == [0, 0, errors.OutOfOrderSequence.code, errors.DUPLICATE, 0]
    else:
        assert codes == [0] * 5
