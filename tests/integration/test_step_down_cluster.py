"""A leader cut from ZooKeeper only steps down before anyone else can be elected (issue 16
item 1; docs/replication.md, Step-down).

Three real servers at the default ZooKeeper settings, R=3; server 1 leads and reaches
ZooKeeper only through a fault proxy, while clients and its followers reach it directly.
The proxy goes dark: server 1's session expires on the ZooKeeper server, a follower wins
epoch 1. Checked, on one machine's wall
clock (the partition znode's mtime is the ZooKeeper server's clock):

- server 1 stepped down (its METADATA says when) before the znode recorded epoch 1;
- a client producing to server 1 only was never acked for a request sent after the
  step-down, nor acked after the election: never two leaders acknowledging;
- an SDK producer is acked again by the new leader within a bound after the election;
- after the heal server 1 follows the new leader and rejoins the in-sync set, and every
  acked record (both producers) is in the log exactly once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from pidlease import errors
from pidlease.cli.verify import verify_topic
from pidlease.client.producer import Producer
from pidlease.testing.devcluster import DEV_SECRET, LocalCluster, http_json
from pidlease.testing.faultproxy import FaultProxy
from pidlease.testing.wire import WireClient, batch, token
from pidlease.wire.cluster import connect_zk, partition_path
from tests.helpers import wait_for

TOPIC = "sd"
RAW_PID = 7_000_001
ENV = {
    "PIDLEASE_FSYNC_INTERVAL_MS": "1",
    "PIDLEASE_REPLICA_LAG_TIME_MAX_MS": "3000",
    "PIDLEASE_HW_CHECKPOINT_INTERVAL_MS": "200",
    # The scenario places leadership by hand (kills and restarts): a restarted preferred
    # replica must not take it back (issue 27's preferred-leader election, on by default).
    "PIDLEASE_PREFERRED_LEADER_ELECTION": "false",
}
# Generous for a loaded machine; the measured figure is printed (issue 16's goal: 2 s).
REACKED_WITHIN_S = 6.0


def state(url: str) -> dict[str, Any]:
    _, body = http_json("GET", f"{url}/v1/topics/{TOPIC}?offsets=false")
    return dict(body["partition_states"][0])


def metadata(address: str) -> dict[str, Any]:
    with WireClient(address, timeout_s=10) as c:
        return c.metadata()


class SdkProducer(threading.Thread):
    """An SDK producer sending without pause; wall time of every ack."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stop = threading.Event()
        self.ack_wall: list[float] = []
        self.futures: list[Any] = []
        self.pid = -1
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Producer(self.url, topic=TOPIC, producer_name="step-down") as p:
                self.pid = p.pid
                i = 0
                while not self.stop.is_set():
                    f = p.send(b"sdk-%d" % i, partition=0)
                    f.add_done_callback(lambda _f: self.ack_wall.append(time.time()))
                    self.futures.append(f)
                    i += 1
                    if i % 10 == 0:
                        time.sleep(0.01)
                p.flush()
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            self.error = exc


class RawLeaderClient(threading.Thread):
    """Produces to server 1 only, one request at a time: (sent, answered, code) per
    request, wall clock. A refused sequence is resent as is."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.stop = threading.Event()
        self.answers: list[tuple[float, float, int]] = []
        self.acked = 0  # sequences 0..acked-1 were acked
        self.error: BaseException | None = None

    def run(self) -> None:
        tok = token(DEV_SECRET, RAW_PID, 1)
        try:
            with WireClient(self.address, timeout_s=60) as c:
                while not self.stop.is_set():
                    sent = time.time()
                    r = c.produce(TOPIC, 0, batch(RAW_PID, 1, self.acked, [b"raw"]), tok)
                    self.answers.append((sent, time.time(), r.error_code))
                    if r.error_code == 0:
                        self.acked += 1
                    else:
                        time.sleep(0.02)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            self.error = exc


def test_a_leader_cut_from_zookeeper_steps_down_before_a_new_leader_is_elected(
    make_cluster: Callable[..., LocalCluster],
) -> None:
    cluster = make_cluster(servers=0, coordinators=0, env=ENV)
    zk_server, _, chroot = cluster.zk_hosts.partition("/")
    with FaultProxy(zk_server.split(",")[0]) as zk_link:
        one = cluster.add_server(1, extra_env={"PIDLEASE_ZK": f"{zk_link.address}/{chroot}"})
        cluster.add_server(2)
        cluster.add_server(3)
        cluster.add_coordinator(1)
        cluster.create_topic(TOPIC, 1, replication_factor=3)
        url = cluster.coordinator_url
        wait_for(lambda: state(url)["leader"] == 1 and len(state(url)["isr"]) == 3, 30, "R=3")

        sdk = SdkProducer(url)
        raw = RawLeaderClient(one.address)
        sdk.start()
        raw.start()
        wait_for(lambda: raw.acked > 20 and len(sdk.ack_wall) > 200, 60, "both producing")

        cut_wall = time.time()
        zk_link.blackhole(60)
        st = wait_for(
            lambda: (s := state(url))["leader"] != 1 and s,
            30,
            "a new leader",
            interval_s=0.05,
        )
        assert st["leader_epoch"] == 1
        zk = connect_zk(cluster.zk_hosts, ensure_roots=False)
        try:
            _, stat = zk.get(partition_path(TOPIC, 0))
        finally:
            zk.stop()
            zk.close()
        elected_wall = stat.mtime / 1000  # ZooKeeper's clock: this machine's
        wait_for(lambda: len([t for t in sdk.ack_wall if t > elected_wall]) > 50, 30, "re-acks")
        raw.stop.set()
        sdk.stop.set()
        raw.join(30)

        steps = metadata(one.address)["step_downs"]["recent"]
        ours = [e for e in steps if e["topic"] == TOPIC and e["epoch"] == 0]
        assert ours, steps
        step_down_wall = ours[0]["wall_ms"] / 1000
        first_reack = min(t for t in sdk.ack_wall if t > elected_wall)
        print(
            f"cut at 0; server 1 stepped down at +{step_down_wall - cut_wall:.3f} s, "
            f"epoch 1 written at +{elected_wall - cut_wall:.3f} s, SDK acked again at "
            f"+{first_reack - cut_wall:.3f} s (+{first_reack - elected_wall:.3f} s after it)"
        )
        assert step_down_wall < elected_wall
        assert first_reack - elected_wall < REACKED_WITHIN_S

        assert raw.error is None, raw.error
        oks = [(s, a) for s, a, code in raw.answers if code == 0]
        assert oks, "server 1 acked nothing before the cut"
        # Nothing acked for a request sent after the step-down, nor after the election.
        assert all(sent < step_down_wall for sent, _ in oks), (step_down_wall, oks[-3:])
        assert all(answered < elected_wall for _, answered in oks)
        refused = [code for s, _, code in raw.answers if s > step_down_wall]
        assert refused and set(refused) <= {
            errors.NotLeader.code,
            errors.SequenceUnknown.code,
        }, set(refused)

        zk_link.heal()
        wait_for(
            lambda: 1 in state(url)["isr"] and state(url)["leader"] != 1,
            60,
            "server 1 back in sync as a follower",
            interval_s=0.2,
        )
        sdk.join(60)
        assert sdk.error is None, sdk.error
        acked = [(0, sdk.pid, f.result(timeout=0).sequence_id) for f in sdk.futures]
        acked += [(0, RAW_PID, seq) for seq in range(raw.acked)]
        report = verify_topic(url, TOPIC, acked=acked)
        assert report.ok, report.summary()
