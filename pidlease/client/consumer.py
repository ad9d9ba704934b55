"""``Consumer``: a member of a consumer group, the same groups Kafka consumers use
(docs/sdk.md, docs/kafka.md "Consumer groups").

Membership goes through the partition servers' Kafka listener with the classic group
protocol (FindCoordinator, JoinGroup, SyncGroup, Heartbeat, OffsetCommit, OffsetFetch,
LeaveGroup), as a Kafka consumer's does, with the ``range`` assignor (which librdkafka
and the Java client also offer): a pidlease ``Consumer`` and a confluent-kafka consumer
with ``partition.assignment.strategy=range`` may share a group. Records are read with
``Reader`` (our own protocol) from the partitions the group assigns, starting at the
group's committed offset (else ``auto_offset_reset``). Offsets are committed only by
``commit()`` (no auto commit): after a crash the group resumes at the last commit.

It is blocking: iteration reads, and rejoins when the background heartbeat hears of a
rebalance; a rebalance lost in between (``commit()`` refused with ILLEGAL_GENERATION,
UNKNOWN_MEMBER_ID or REBALANCE_IN_PROGRESS) raises ``CommitFailed`` and the next
iteration rejoins, as Kafka's consumers do.

TLS and tokens take the producer's settings: ``tls_ca_file`` / ``tls`` (else
``PIDLEASE_TLS_CA_FILE``) and ``api_token`` (else ``PIDLEASE_API_TOKEN``) serve the
coordinator's HTTPS, the partition servers' protocol and the Kafka listener alike: the
listener speaks TLS when its server does, and with a token the consumer authenticates there
with SASL/PLAIN as the principal the token belongs to (an empty user name; the listener
finds the principal by the token, as the coordinator does for a Bearer token). Not done:
``AsyncConsumer``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any, Literal, Self

from pidlease import errors
from pidlease.client.lease_client import API_TOKEN_ENV, LeaseClient, coordinator_base_url
from pidlease.client.reader import Reader
from pidlease.errors import CommitFailed
from pidlease.wire import protocol
from pidlease.wire.kafka_conn import KafkaConn as _Conn
from pidlease.wire.kafka_conn import SaslRefused
from pidlease.wire.kafka_errors import (
    COORDINATOR_LOAD_IN_PROGRESS,
    COORDINATOR_NOT_AVAILABLE,
    GROUP_ID_NOT_FOUND,
    ILLEGAL_GENERATION,
    MEMBER_ID_REQUIRED,
    NON_EMPTY_GROUP,
    NONE,
    NOT_COORDINATOR,
    REBALANCE_IN_PROGRESS,
    UNKNOWN_MEMBER_ID,
)
from pidlease.wire.tls import client_ssl_context

__all__ = ["CommitFailed", "Consumer"]

FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 10, 11, 12, 13, 14
OFFSET_COMMIT, OFFSET_FETCH = 8, 9
_RETRIABLE = {COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR}
_REJOIN = {ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS}
ASSIGNOR = "range"
TP = tuple[str, int]


class Consumer:
    def __init__(
        self,
        url: str,
        topics: list[str],
        group: str,
        *,
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 1_000,
        auto_offset_reset: Literal["earliest", "latest"] = "earliest",
        poll_interval_ms: float = 200,
        request_timeout_s: float = 30.0,
        client_id: str = "pidlease-consumer",
        api_token: str | None = None,
        tls_ca_file: str | None = None,
        tls: bool = False,
    ) -> None:
        if not topics or not all(isinstance(t, str) and t for t in topics):
            raise errors.ConfigError("topics must be a non-empty list of topic names")
        if not isinstance(group, str) or not group:
            raise errors.ConfigError("group must be a non-empty string")
        if auto_offset_reset not in ("earliest", "latest"):
            raise errors.ConfigError('auto_offset_reset must be "earliest" or "latest"')
        self.url = coordinator_base_url(url)
        self.topics = list(topics)
        self.group = group
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_s = heartbeat_interval_ms / 1000
        self.reset = auto_offset_reset
        self.poll_s = poll_interval_ms / 1000
        self.timeout_s = request_timeout_s
        self.client_id = client_id
        # connection setup: the producer's TLS and token settings, for every door
        self._ssl = client_ssl_context(tls_ca_file, tls)
        token = api_token if api_token is not None else os.environ.get(API_TOKEN_ENV, "")
        self._sasl = ("", token) if token else None
        self._auth: dict[str, Any] = {"api_token": api_token, "tls_ca_file": tls_ca_file}
        self._auth["tls"] = tls
        self.member_id = ""
        self.generation = -1
        self.positions: dict[TP, int] = {}  # next offset to read, per assigned partition
        self._readers: dict[TP, Reader] = {}
        self._coord: _Conn | None = None
        self._lock = threading.Lock()  # one request at a time on the coordinator connection
        self._rejoin = True
        self._closed = False
        self._closing = threading.Event()  # wakes the heartbeat thread at close
        self._hb: threading.Thread | None = None

    # -- what users call -------------------------------------------------------------------
    @property
    def assignment(self) -> list[TP]:
        return sorted(self.positions)

    def __iter__(self) -> Iterator[protocol.Record]:
        while not self._closed:
            yield from self.poll(1.0)

    def poll(self, timeout_s: float = 1.0, max_records: int = 500) -> list[protocol.Record]:
        """The records available within ``timeout_s`` (none: an empty list); joins or
        rejoins the group first when needed."""
        deadline = time.monotonic() + timeout_s
        while not self._closed:
            if self._rejoin:
                self._join()
            out = self._round(max_records)
            left = deadline - time.monotonic()
            if out or left <= 0:
                return out
            time.sleep(min(self.poll_s, left))
        return []

    def _round(self, max_records: int) -> list[protocol.Record]:
        out: list[protocol.Record] = []
        for tp in list(self.positions):
            if self._rejoin or len(out) >= max_records:
                break
            reader = self._reader(tp)
            for rec in reader:
                out.append(rec)
                self.positions[tp] = rec.offset + 1
                if self._rejoin or len(out) >= max_records:
                    break
            else:
                if tp in self.positions:
                    self.positions[tp] = max(self.positions[tp], reader.position)
        return out

    def sync_membership(self) -> bool:
        """Join, or rejoin after a rebalance the heartbeat heard of, without reading: for a
        member that reads on its own and keeps its positions elsewhere (``Processor``).
        True when it (re)joined: ``assignment`` and ``generation`` are the new ones."""
        if self._closed or not self._rejoin:
            return False
        self._join()
        return True

    def commit(self) -> None:
        """Commit the next offset of every assigned partition (what was read so far)."""
        offsets = {tp: o for tp, o in self.positions.items() if o >= 0}
        if not offsets:
            return
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (t, p), o in sorted(offsets.items()):
            by_topic.setdefault(t, []).append(
                {"partition_index": p, "committed_offset": o, "committed_metadata": ""}
            )
        r = self._request(
            OFFSET_COMMIT,
            5,
            {
                "group_id": self.group,
                "generation_id_or_member_epoch": self.generation,
                "member_id": self.member_id,
                "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()],
            },
        )
        codes = {int(p.error_code) for t in r.topics for p in t.partitions}
        if codes - {NONE}:
            if codes & _REJOIN:
                self._rejoin = True
            raise CommitFailed(f"offsets not committed (Kafka error codes {sorted(codes)})")

    def committed(self, partition: int, topic: str | None = None) -> int | None:
        """The group's committed offset of a partition (None when there is none)."""
        t = topic or self.topics[0]
        got = self._fetch_offsets([(t, partition)])
        return got.get((t, partition))

    def seek(self, partition: int, offset: int, topic: str | None = None) -> None:
        """Read an assigned partition from ``offset`` on."""
        tp = (topic or self.topics[0], partition)
        if tp not in self.positions:
            raise errors.ConfigError(f"partition {tp} is not assigned to this consumer")
        self.positions[tp] = offset
        self._readers.pop(tp, None)

    def close(self) -> None:
        """Leave the group (its partitions go to the others at once) and stop."""
        if self._closed:
            return
        self._closed = True
        self._closing.set()
        if self.member_id and self._coord is not None:
            # On failure the session timeout removes us instead.
            with contextlib.suppress(OSError, errors.PidleaseError):
                self._request(LEAVE_GROUP, 1, {"group_id": self.group, "member_id": self.member_id})
        if self._hb is not None:
            self._hb.join(self.heartbeat_s + 5)
        with self._lock:
            if self._coord is not None:
                self._coord.close()
                self._coord = None
        for r in self._readers.values():
            r.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- membership ------------------------------------------------------------------------
    def _join(self) -> None:
        deadline = time.monotonic() + max(self.timeout_s, self.session_timeout_ms / 500)
        while True:
            if time.monotonic() > deadline:
                raise errors.CoordinatorUnavailable(f"could not join group {self.group!r}")
            try:
                if self._join_once():
                    self._rejoin = False
                    self._start_heartbeat()
                    return
            except OSError:
                self._drop_coordinator()
            time.sleep(0.2)

    def _join_once(self) -> bool:
        meta = _subscription(self.topics)
        r = self._request(
            JOIN_GROUP,
            5,
            {
                "group_id": self.group,
                "session_timeout": dt.timedelta(milliseconds=self.session_timeout_ms),
                "rebalance_timeout": dt.timedelta(milliseconds=self.session_timeout_ms),
                "member_id": self.member_id,
                "group_instance_id": None,
                "protocol_type": "consumer",
                "protocols": [{"name": ASSIGNOR, "metadata": meta}],
            },
        )
        code = int(r.error_code)
        if code == MEMBER_ID_REQUIRED:
            self.member_id = r.member_id
            return False
        if code == UNKNOWN_MEMBER_ID:
            self.member_id = ""
            return False
        if code in _RETRIABLE:
            self._drop_coordinator()
            return False
        if code != NONE:
            if code in _REJOIN:
                return False
            raise errors.InvalidRequest(f"JoinGroup refused with Kafka error {code}")
        self.member_id, self.generation = r.member_id, r.generation_id
        plan: dict[str, bytes] = {}
        if r.leader == r.member_id:
            subs = {m.member_id: _parse_subscription(bytes(m.metadata)) for m in r.members}
            plan = self._assign(subs)
        s = self._request(
            SYNC_GROUP,
            3,
            {
                "group_id": self.group,
                "generation_id": self.generation,
                "member_id": self.member_id,
                "group_instance_id": None,
                "assignments": [{"member_id": m, "assignment": a} for m, a in plan.items()],
            },
        )
        code = int(s.error_code)
        if code != NONE:
            if code in _RETRIABLE:
                self._drop_coordinator()
            return False
        mine = _parse_assignment(bytes(s.assignment))
        self._take(mine)
        return True

    def _assign(self, subs: dict[str, list[str]]) -> dict[str, bytes]:
        """The range assignor: per topic, partitions split in contiguous ranges over the
        subscribed members sorted by id, the first ones getting one more."""
        out: dict[str, dict[str, list[int]]] = {m: {} for m in subs}
        for topic in sorted({t for ts in subs.values() for t in ts}):
            n = self._partitions_of(topic)
            members = sorted(m for m, ts in subs.items() if topic in ts)
            per, extra = divmod(n, len(members))
            at = 0
            for i, m in enumerate(members):
                k = per + (1 if i < extra else 0)
                if k:
                    out[m][topic] = list(range(at, at + k))
                at += k
        return {m: _assignment(a) for m, a in out.items()}

    def _partitions_of(self, topic: str) -> int:
        try:
            with self._http() as c:
                return c.topic(topic, offsets=False).partitions
        except (errors.UnknownTopicOrPartition, errors.CoordinatorUnavailable):
            return 0

    def _http(self) -> LeaseClient:
        return LeaseClient(self.url, request_timeout_ms=int(self.timeout_s * 1000), **self._auth)

    def _take(self, assigned: dict[str, list[int]]) -> None:
        tps = {(t, p) for t, ps in assigned.items() for p in ps}
        for tp in list(self.positions):
            if tp not in tps:
                del self.positions[tp]
                r = self._readers.pop(tp, None)
                if r is not None:
                    r.close()
        new = sorted(tps - set(self.positions))
        committed = self._fetch_offsets(new) if new else {}
        for tp in new:
            off = committed.get(tp)
            if off is None:
                self._readers[tp] = Reader(self.url, tp[0], tp[1], start=self.reset, **self._auth)
                self.positions[tp] = -1  # the reader's start decides
            else:
                self.positions[tp] = off

    def _reader(self, tp: TP) -> Reader:
        r = self._readers.get(tp)
        pos = self.positions[tp]
        if r is None or (pos >= 0 and r.position != pos):
            r = Reader(self.url, tp[0], tp[1], start_offset=pos, **self._auth)
            self._readers[tp] = r
        return r

    def _fetch_offsets(self, tps: list[TP]) -> dict[TP, int]:
        by_topic: dict[str, list[int]] = {}
        for t, p in tps:
            by_topic.setdefault(t, []).append(p)
        deadline = time.monotonic() + self.timeout_s
        while True:
            r = self._request(
                OFFSET_FETCH,
                5,
                {
                    "group_id": self.group,
                    "topics": [{"name": t, "partition_indexes": ps} for t, ps in by_topic.items()],
                },
            )
            code = int(r.error_code)
            if code == NONE:
                break
            if code not in _RETRIABLE or time.monotonic() > deadline:
                raise errors.CoordinatorUnavailable(f"OffsetFetch refused with Kafka error {code}")
            self._drop_coordinator()
            time.sleep(0.2)
        return {
            (t.name, p.partition_index): int(p.committed_offset)
            for t in r.topics
            for p in t.partitions
            if int(p.committed_offset) >= 0
        }

    def _start_heartbeat(self) -> None:
        if self._hb is not None and self._hb.is_alive():
            return
        self._hb = threading.Thread(target=self._heartbeats, name="pidlease-heartbeat", daemon=True)
        self._hb.start()

    def _heartbeats(self) -> None:
        while not self._closed:
            self._closing.wait(self.heartbeat_s)
            if self._closed or self._rejoin:
                continue
            try:
                r = self._request(
                    HEARTBEAT,
                    3,
                    {
                        "group_id": self.group,
                        "generation_id": self.generation,
                        "member_id": self.member_id,
                        "group_instance_id": None,
                    },
                )
                code = int(r.error_code)
            except (OSError, errors.PidleaseError):
                code = NOT_COORDINATOR
            if code in _RETRIABLE:
                self._drop_coordinator()
            if code != NONE:
                self._rejoin = True

    # -- the coordinator connection --------------------------------------------------------
    def _request(self, api_key: int, version: int, values: dict[str, Any]) -> Any:
        with self._lock:
            if self._coord is None:
                self._coord = self._find_coordinator()
            try:
                return self._coord.request(api_key, version, values)
            except OSError:
                self._coord.close()
                self._coord = None
                raise

    def _drop_coordinator(self) -> None:
        with self._lock:
            if self._coord is not None:
                self._coord.close()
                self._coord = None

    def _find_coordinator(self) -> _Conn:
        deadline = time.monotonic() + self.timeout_s
        last = ""
        while time.monotonic() < deadline:
            for addr in self._bootstrap():
                try:
                    with self._conn(addr) as c:
                        r = c.request(FIND_COORDINATOR, 1, {"key": self.group, "key_type": 0})
                    if int(r.error_code) == NONE:
                        return self._conn(f"{r.host}:{r.port}")
                    last = f"Kafka error {int(r.error_code)}"
                except SaslRefused as exc:  # retrying cannot help
                    raise errors.Unauthorized(
                        f"the Kafka listener at {addr} refused the api_token: {exc}"
                    ) from exc
                except OSError as exc:
                    last = str(exc)
            time.sleep(0.2)
        raise errors.CoordinatorUnavailable(f"no coordinator for group {self.group!r}: {last}")

    def _conn(self, address: str) -> _Conn:
        return _Conn(
            address, self.client_id, self.timeout_s, ssl_context=self._ssl, sasl=self._sasl
        )

    def _bootstrap(self) -> list[str]:
        try:
            with self._http() as c:
                servers = c.call("GET", "/v1/servers").get("servers", [])
        except errors.CoordinatorUnavailable:
            servers = []
        out = [f"{s['host']}:{s['kafka_port']}" for s in servers if s.get("kafka_port")]
        if not out:
            raise errors.CoordinatorUnavailable("no partition server has a Kafka listener")
        return out


# -- Kafka's consumer protocol (subscription and assignment) ------------------------------------
def _subscription(topics: list[str]) -> bytes:
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        b = t.encode()
        out += struct.pack(">h", len(b)) + b
    return out + struct.pack(">i", -1)


def _parse_subscription(meta: bytes) -> list[str]:
    try:
        (n,) = struct.unpack_from(">i", meta, 2)
        pos, out = 6, []
        for _ in range(n):
            (ln,) = struct.unpack_from(">h", meta, pos)
            out.append(meta[pos + 2 : pos + 2 + ln].decode())
            pos += 2 + ln
        return out
    except (struct.error, UnicodeDecodeError):
        return []


def _assignment(parts: dict[str, list[int]]) -> bytes:
    out = struct.pack(">hi", 0, len(parts))
    for t, ps in sorted(parts.items()):
        b = t.encode()
        out += struct.pack(">h", len(b)) + b + struct.pack(">i", len(ps))
        out += b"".join(struct.pack(">i", p) for p in ps)
    return out + struct.pack(">i", -1)


def _parse_assignment(data: bytes) -> dict[str, list[int]]:
    if len(data) < 6:
        return {}
    (n,) = struct.unpack_from(">i", data, 2)
    pos, out = 6, {}
    for _ in range(n):
        (ln,) = struct.unpack_from(">h", data, pos)
        topic = data[pos + 2 : pos + 2 + ln].decode()
        pos += 2 + ln
        (k,) = struct.unpack_from(">i", data, pos)
        pos += 4
        out[topic] = list(struct.unpack_from(f">{k}i", data, pos))
        pos += 4 * k
    return out


# -- a blocking Kafka connection (kio's message schemas) -----------------------------------------
# -- groups as a whole (``pidlease groups``) -----------------------------------------------------
DELETE_GROUPS, DESCRIBE_GROUPS, LIST_GROUPS = 42, 15, 16


class _Door:
    """How the group functions below reach a cluster: the Consumer's settings (token and CA
    file, else ``PIDLEASE_API_TOKEN`` / ``PIDLEASE_TLS_CA_FILE``) for the coordinator's
    HTTP(S) and the Kafka listeners' TLS and SASL/PLAIN."""

    def __init__(
        self, url: str, timeout_s: float, api_token: str | None, tls_ca_file: str | None
    ) -> None:
        self.url, self.timeout_s = coordinator_base_url(url), timeout_s
        self.auth: dict[str, Any] = {"api_token": api_token, "tls_ca_file": tls_ca_file}
        self.ssl = client_ssl_context(tls_ca_file)
        token = api_token if api_token is not None else os.environ.get(API_TOKEN_ENV, "")
        self.sasl = ("", token) if token else None

    def http(self) -> LeaseClient:
        return LeaseClient(self.url, request_timeout_ms=int(self.timeout_s * 1000), **self.auth)

    def conn(self, address: str) -> _Conn:
        try:
            return _Conn(
                address, "pidlease-cli", self.timeout_s, ssl_context=self.ssl, sasl=self.sasl
            )
        except SaslRefused as exc:
            raise errors.Unauthorized(
                f"the Kafka listener at {address} refused the api_token: {exc}"
            ) from exc


def _servers(door: _Door) -> list[str]:
    with door.http() as c:
        servers = c.call("GET", "/v1/servers").get("servers", [])
    out = [f"{s['host']}:{s['kafka_port']}" for s in servers if s.get("kafka_port")]
    if not out:
        raise errors.CoordinatorUnavailable("no partition server has a Kafka listener")
    return out


def _group_conn(door: _Door, group: str) -> _Conn:
    deadline = time.monotonic() + door.timeout_s
    last = 0
    while time.monotonic() < deadline:
        for addr in _servers(door):
            with door.conn(addr) as c:
                r = c.request(FIND_COORDINATOR, 1, {"key": group, "key_type": 0})
            if int(r.error_code) == NONE:
                return door.conn(f"{r.host}:{r.port}")
            last = int(r.error_code)
        time.sleep(0.2)
    raise errors.CoordinatorUnavailable(f"no coordinator for group {group!r} (Kafka error {last})")


def list_groups(
    url: str,
    timeout_s: float = 30.0,
    *,
    api_token: str | None = None,
    tls_ca_file: str | None = None,
) -> list[dict[str, str]]:
    """Every group of the cluster: (group, protocol type, state), from every server."""
    door = _Door(url, timeout_s, api_token, tls_ca_file)
    out: dict[str, dict[str, str]] = {}
    for addr in _servers(door):
        with door.conn(addr) as c:
            deadline = time.monotonic() + timeout_s
            while True:
                r = c.request(LIST_GROUPS, 4, {"states_filter": []})
                if int(r.error_code) != COORDINATOR_LOAD_IN_PROGRESS:
                    break
                if time.monotonic() > deadline:
                    raise errors.CoordinatorUnavailable(f"{addr}: groups still loading")
                time.sleep(0.2)
        for g in r.groups:
            out[g.group_id] = {
                "group": g.group_id,
                "protocol_type": g.protocol_type,
                "state": g.group_state,
            }
    return [out[k] for k in sorted(out)]


def describe_group(
    url: str,
    group: str,
    timeout_s: float = 30.0,
    *,
    api_token: str | None = None,
    tls_ca_file: str | None = None,
) -> dict[str, Any]:
    """A group's state, members (with their partitions) and committed offsets, with the
    lag of each (the partition's high watermark minus the commit)."""
    door = _Door(url, timeout_s, api_token, tls_ca_file)
    with _group_conn(door, group) as c:
        d = c.request(DESCRIBE_GROUPS, 5, {"groups": [group]}).groups[0]
        o = c.request(OFFSET_FETCH, 5, {"group_id": group, "topics": None})
    if int(d.error_code) != NONE:
        raise errors.CoordinatorUnavailable(f"DescribeGroups: Kafka error {int(d.error_code)}")
    members = []
    for m in d.members:
        parts = (
            _parse_assignment(bytes(m.member_assignment)) if d.protocol_type == "consumer" else {}
        )
        members.append(
            {
                "member_id": m.member_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "partitions": {t: sorted(ps) for t, ps in parts.items()},
            }
        )
    hws: dict[str, dict[int, int]] = {}
    offsets = []
    for t in o.topics:
        if t.name not in hws:
            try:
                with door.http() as h:
                    rows = h.call("GET", f"/v1/topics/{t.name}").get("partition_states", [])
            except (errors.UnknownTopicOrPartition, errors.CoordinatorUnavailable):
                rows = []
            hws[t.name] = {int(x["partition"]): int(x.get("high_watermark", -1)) for x in rows}
        for p in t.partitions:
            hw = hws[t.name].get(p.partition_index, -1)
            off = int(p.committed_offset)
            offsets.append(
                {
                    "topic": t.name,
                    "partition": p.partition_index,
                    "committed": off,
                    "high_watermark": hw,
                    "lag": hw - off if hw >= 0 and off >= 0 else None,
                }
            )
    return {
        "group": group,
        "state": d.group_state,
        "protocol_type": d.protocol_type,
        "protocol": d.protocol_data,
        "members": members,
        "offsets": offsets,
    }


def delete_group(
    url: str,
    group: str,
    timeout_s: float = 30.0,
    *,
    api_token: str | None = None,
    tls_ca_file: str | None = None,
) -> None:
    """Delete an empty group and its committed offsets."""
    with _group_conn(_Door(url, timeout_s, api_token, tls_ca_file), group) as c:
        r = c.request(DELETE_GROUPS, 2, {"groups_names": [group]})
    code = int(r.results[0].error_code)
    if code == NON_EMPTY_GROUP:
        raise errors.InvalidRequest(f"group {group!r} has members: stop them first")
    if code == GROUP_ID_NOT_FOUND:
        raise errors.InvalidRequest(f"no group {group!r}")
    if code != NONE:
        raise errors.CoordinatorUnavailable(f"DeleteGroups: Kafka error {code}")
