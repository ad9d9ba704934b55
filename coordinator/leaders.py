"""Calls from the coordinator to partition leaders over the binary protocol: PRODUCER_STATE
(a PID's durable highwater at lease time), FENCE (record a takeover's new generation) and
METADATA (offsets for topic descriptions); PRODUCER_STATES and FENCES ask the same for one
PID on many partitions of one leader in one request; PRODUCER_LIST pages through every PID's
row on the partitions a leader leads (the operator's view, ``live_rows.py``).

Blocking sockets, because the coordinator's request handlers run on threads (kazoo is
thread-based): the protocol client is ``pidlease.wire.blocking_conn`` (the SDK reader's
too); this module adds the pool and the errors. A small pool keeps up to
``connections_max`` idle connections per leader;
each call has one deadline for connect, send and receive. Every failure to reach a leader
becomes ``CoordinatorUnavailable`` (retriable 503), never a hang.

With ``ssl_context`` set (a coordinator serving HTTPS: ``pidlease/wire/tls.py``, every
connection to a partition server is TLS, the server's certificate checked against the
coordinator's ``tls_ca_file`` and the address it is reached at.
"""

from __future__ import annotations

import itertools
import ssl
import threading
import time
from collections.abc import Callable, Sequence

from pidlease import errors
from pidlease.errors import (
    CoordinatorUnavailable,
    CorruptRecord,
    PidleaseError,
    ServerUnavailable,
    Unauthorized,
)
from pidlease.wire import protocol
from pidlease.wire.blocking_conn import BlockingConnection

# What one more partition may add to a PRODUCER_STATES / FENCES call's deadline: a FENCES
# answer waits until every fence is durable on the partitions' in-sync followers, and with
# one fetch loop per followed partition (docs/replication.md, "Not done / limits") 333
# fences took 5-11 s on a loaded 2-core machine (issue 24).
MANY_MS_PER_PARTITION = 30


def many_timeout_s(timeout_s: float, partitions: int) -> float:
    """The deadline of one call for ``partitions`` partitions: the one-partition deadline
    ``timeout_s`` and ``MANY_MS_PER_PARTITION`` for each."""
    return timeout_s + partitions * MANY_MS_PER_PARTITION / 1000


class LeaderClient:
    def __init__(
        self,
        *,
        timeout_ms: int = 5_000,
        connections_max: int = 8,
        frame_bytes_max: int = protocol.FRAME_BYTES_MAX_DEFAULT,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.ssl_context = ssl_context
        self._timeout_s = timeout_ms / 1000
        self._connections_max = connections_max
        self._frame_bytes_max = frame_bytes_max
        self._idle: dict[str, list[BlockingConnection]] = {}
        self._lock = threading.Lock()
        self._corr = itertools.count(1)
        self._closed = False
        self.calls = 0
        self.failures = 0

    # -- public calls ----------------------------------------------------------------------
    def producer_state(
        self, address: str, topic: str, partition: int, pid: int
    ) -> protocol.Response:
        return self._call(
            address,
            protocol.PRODUCER_STATE,
            lambda c: protocol.producer_state_request(c, topic, partition, pid),
        )

    def fence(
        self,
        address: str,
        topic: str,
        partition: int,
        pid: int,
        generation: int,
        token: str,
        *,
        create_if_absent: bool,
        leased_since_ms: int = 0,
    ) -> protocol.Response:
        # Safe to resend: fencing the same generation twice leaves the same state.
        return self._call(
            address,
            protocol.FENCE,
            lambda c: protocol.fence_request(
                c,
                topic,
                partition,
                pid,
                generation,
                token,
                create_if_absent=create_if_absent,
                leased_since_ms=leased_since_ms,
            ),
        )

    def producer_states(
        self, address: str, pid: int, partitions: Sequence[tuple[str, int]]
    ) -> list[protocol.Response]:
        """PRODUCER_STATE of ``pid`` on each of ``partitions`` (all led by ``address``, at
        most ``PARTITIONS_PER_REQUEST_MAX``) in one request: one answer per partition, in
        order, each with its own ``error_code``."""
        resp = self._call(
            address,
            protocol.PRODUCER_STATES,
            lambda c: protocol.producer_states_request(c, pid, partitions),
            timeout_s=self._many_timeout_s(len(partitions)),
        )
        return self._entries(address, resp, len(partitions))

    def fences(
        self,
        address: str,
        pid: int,
        generation: int,
        token: str,
        entries: Sequence[protocol.PartitionEntry],
    ) -> list[protocol.Response]:
        """FENCE on each of ``entries``' partitions in one request, answered once every
        fence is durable: one answer per partition, in order. Safe to resend."""
        resp = self._call(
            address,
            protocol.FENCES,
            lambda c: protocol.fences_request(c, pid, generation, token, entries),
            timeout_s=self._many_timeout_s(len(entries)),
        )
        return self._entries(address, resp, len(entries))

    def _many_timeout_s(self, n: int) -> float:
        return many_timeout_s(self._timeout_s, n)

    def _entries(self, address: str, resp: protocol.Response, n: int) -> list[protocol.Response]:
        if (
            resp.error_code != errors.NONE
        ):  # the request as a whole was refused: every entry says so
            return [protocol.Response(0, resp.error_code, resp.detail) for _ in range(n)]
        if resp.entries is None or len(resp.entries) != n:
            self.failures += 1
            raise CoordinatorUnavailable(
                f"partition leader {address} answered {len(resp.entries or [])} partitions of {n}"
            )
        return resp.entries

    def producer_list(
        self,
        address: str,
        rows_max: int = protocol.PRODUCER_LIST_ROWS_MAX,
        after: tuple[str, int, int] = ("", -1, -1),
    ) -> protocol.Response:
        """One page of PRODUCER_LIST: the producer-state rows of the partitions ``address``
        leads, after the cursor ``after`` (``rows``; ``existed``: more to ask). The deadline
        grows with the page, like a PRODUCER_STATES call's with its partitions."""
        return self._call(
            address,
            protocol.PRODUCER_LIST,
            lambda c: protocol.producer_list_request(c, rows_max, after),
            timeout_s=self._timeout_s + rows_max / 100_000,
        )

    def metadata(self, address: str) -> protocol.Response:
        return self._call(address, protocol.METADATA, protocol.metadata_request)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            socks = [s for lst in self._idle.values() for s in lst]
            self._idle.clear()
        for s in socks:
            s.close()

    # -- plumbing --------------------------------------------------------------------------
    def _take(self, address: str) -> BlockingConnection | None:
        with self._lock:
            idle = self._idle.get(address)
            return idle.pop() if idle else None

    def _give_back(self, address: str, conn: BlockingConnection) -> None:
        with self._lock:
            idle = self._idle.setdefault(address, [])
            if not self._closed and len(idle) < self._connections_max:
                idle.append(conn)
                return
        conn.close()

    def _call(
        self,
        address: str,
        api_key: int,
        build: Callable[[int], bytes],
        *,
        timeout_s: float | None = None,
    ) -> protocol.Response:
        self.calls += 1
        timeout_s = timeout_s or self._timeout_s
        end = time.monotonic() + timeout_s
        name = protocol.API_NAMES[api_key]
        # A pooled connection may have been closed by the server while idle; that shows
        # up as an error before any answer arrives, and one fresh connection is tried.
        for attempt in (0, 1):
            conn = self._take(address) if attempt == 0 else None
            reused = conn is not None
            try:
                left = end - time.monotonic()
                if left <= 0:
                    raise ServerUnavailable("deadline passed") from TimeoutError()
                if conn is None:
                    conn = BlockingConnection(
                        address,
                        timeout_ms=max(1, int(left * 1000)),
                        frame_bytes_max=self._frame_bytes_max,
                        ssl_context=self.ssl_context,
                        what="partition leader",
                    )
                    reused = False
                resp = conn.request(api_key, build, timeout_s=end - time.monotonic())
            except (ServerUnavailable, Unauthorized) as exc:
                if conn is not None:
                    conn.close()
                cause = exc.__cause__
                if reused and isinstance(cause, (EOFError, ConnectionError)):
                    continue
                self.failures += 1
                raise self._unavailable(address, name, timeout_s, conn is None, exc) from exc
            self._give_back(address, conn)
            return resp
        raise AssertionError("unreachable")

    @staticmethod
    def _unavailable(
        address: str, name: str, timeout_s: float, connecting: bool, exc: PidleaseError
    ) -> CoordinatorUnavailable:
        """What a failed call to a leader becomes: always retriable (503)."""
        cause = exc.__cause__
        if isinstance(exc, Unauthorized) or isinstance(cause, ssl.SSLError):
            return CoordinatorUnavailable(
                f"TLS with partition leader {address} failed ({name}): {exc.detail}"
            )
        if isinstance(cause, CorruptRecord):
            return CoordinatorUnavailable(
                f"partition leader {address} sent a malformed {name} answer: {cause.detail}"
            )
        if isinstance(cause, TimeoutError) or (
            not connecting and isinstance(cause, OSError) and not isinstance(cause, ConnectionError)
        ):
            return CoordinatorUnavailable(
                f"partition leader {address} did not answer {name} within "
                f"{timeout_s * 1000:.0f} ms: {exc.detail}"
            )
        return CoordinatorUnavailable(
            f"partition leader {address} unreachable ({name}): {exc.detail}"
        )
