"""``Reader``: an iterator over one partition's records, fetched from its leader.

Pulsar's topic reader, for Python: the caller picks the partition and the start offset and
keeps its own position (``reader.position`` is the next offset it would return). The
reader asks the coordinator which server leads the partition, fetches whole stored batches
(``pidlease.wire.protocol``), checks their checksums, and yields ``Record`` objects from
``start_offset`` on. Control batches (the fence records a takeover writes) take an offset
but are skipped unless ``include_control``. When the leader is lost (connection error,
NOT_LEADER), it looks the leader up again and retries with backoff for up to
``retry_timeout_ms``. With ``stop_at_end`` (the default) iteration ends at the high
watermark seen by the last fetch; without it the reader polls for new records. A position
below the partition's log start (records retention deleted) raises ``OffsetOutOfRange``
with the ``earliest`` and ``latest`` offsets: fatal to that reader. ``start="earliest"``
(the log start), ``start="latest"`` (the high watermark: only records written from now
on) or ``start_timestamp_ms=T`` (the first batch whose timestamp is at or after T; the high
watermark when there is none) picks the start from the partition instead of
``start_offset``: one LIST_OFFSETS request to the leader before the first fetch.

It is blocking (one plain socket, no event loop). Sockets are opened per iteration and
closed when it ends (or when an abandoned iterator is garbage-collected); ``close()`` or a
``with`` block closes them at once. ``tls_ca_file=`` (or ``tls=True`` for the system trust
store) reads from TLS partition servers (``pidlease/wire/tls.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Literal, Self

import httpx

from pidlease import errors
from pidlease.client.connection import BlockingConnection
from pidlease.client.lease_client import LeaseClient, coordinator_base_url
from pidlease.wire import protocol
from pidlease.wire.tls import client_ssl_context

FETCH_BYTES_DEFAULT = 1024 * 1024
# How often a start by LIST_OFFSETS is asked again when retention deleted the offset found
# before the first fetch (each round means a whole segment went in between: rare).
START_RETRIES_MAX = 3


class Reader:
    def __init__(
        self,
        coordinator_url: str,
        topic: str,
        partition: int = 0,
        start_offset: int = 0,
        *,
        start: Literal["earliest", "latest"] | None = None,
        start_timestamp_ms: int | None = None,
        stop_at_end: bool = True,
        include_control: bool = False,
        fetch_bytes_max: int = FETCH_BYTES_DEFAULT,
        poll_interval_ms: float = 200,
        retry_timeout_ms: float = 30_000,
        request_timeout_ms: int = 30_000,
        http_transport: httpx.BaseTransport | None = None,
        api_token: str | None = None,
        tls_ca_file: str | None = None,
        tls: bool = False,
        sleep: Callable[[float], None] = time.sleep,
        clock_ms: Callable[[], float] | None = None,
    ) -> None:
        if not isinstance(partition, int) or partition < 0:
            raise errors.ConfigError(f"partition must be a non-negative int, not {partition!r}")
        if not isinstance(start_offset, int) or start_offset < 0:
            raise errors.ConfigError(
                f"start_offset must be a non-negative int, not {start_offset!r}"
            )
        if start not in (None, "earliest", "latest"):
            raise errors.ConfigError(f'start must be "earliest" or "latest", not {start!r}')
        if start_timestamp_ms is not None and (
            not isinstance(start_timestamp_ms, int)
            or isinstance(start_timestamp_ms, bool)
            or start_timestamp_ms < 0
        ):
            raise errors.ConfigError(
                f"start_timestamp_ms must be a non-negative int (ms since the epoch), "
                f"not {start_timestamp_ms!r}"
            )
        chosen = [
            name
            for name, given in (
                ("start_offset", start_offset != 0),
                ("start", start is not None),
                ("start_timestamp_ms", start_timestamp_ms is not None),
            )
            if given
        ]
        if len(chosen) > 1:
            but = "not both" if len(chosen) == 2 else "only one of them"
            raise errors.ConfigError(f"give {' or '.join(chosen)}, {but}")
        if not 1024 <= fetch_bytes_max <= protocol.FRAME_BYTES_MAX_DEFAULT // 2:
            raise errors.ConfigError("fetch_bytes_max must be 1024..8 MiB")
        self.topic = topic
        self.partition = partition
        self.position = start_offset
        # The LIST_OFFSETS question the start is, resolved to a position at the first fetch.
        self._start_query: int | None = _start_query(start, start_timestamp_ms)
        self.stop_at_end = stop_at_end
        self.include_control = include_control
        self.high_watermark = -1
        self._fetch_bytes = fetch_bytes_max
        self._fetch_bytes_max = protocol.FRAME_BYTES_MAX_DEFAULT // 2
        self._poll_s = poll_interval_ms / 1000
        self._retry_timeout_ms = retry_timeout_ms
        self._request_timeout_ms = request_timeout_ms
        self._sleep = sleep
        self._clock_ms = clock_ms or (lambda: time.monotonic() * 1000)
        self._coordinator_url = coordinator_base_url(coordinator_url)
        self._http_transport = http_transport
        self._api_token = api_token
        self._tls_ca_file, self._tls = tls_ca_file, tls
        self._ssl = client_ssl_context(tls_ca_file, tls)
        self._client: LeaseClient | None = None  # opened per iteration, closed when it ends
        self._conn: BlockingConnection | None = None
        self._leader: str | None = None

    def __iter__(self) -> Iterator[protocol.Record]:
        try:
            yield from self._records()
        finally:
            self.close()

    def _records(self) -> Iterator[protocol.Record]:
        first: protocol.Response | None = None
        if self._start_query is not None:
            first = self._fetch_from_start(self._start_query)
            self._start_query = None
        while True:
            resp = first if first is not None else self._fetch(self.position)
            first = None
            self.high_watermark = resp.high_watermark
            data = resp.data if resp.data is not None else memoryview(b"")
            got_batch = False
            for h, pos in protocol.iter_batches(data):
                got_batch = True
                if h.last_offset < self.position:
                    continue
                for rec in protocol.iter_records(data, h, pos, self.topic, self.partition):
                    if rec.offset < self.position:
                        continue
                    self.position = rec.offset + 1
                    if rec.is_control and not self.include_control:
                        continue
                    yield rec
            if got_batch:
                continue
            if self.position < resp.log_start_offset:
                # Records were deleted under this reader: skipping them silently would lose
                # them without a word (servers answer OFFSET_OUT_OF_RANGE themselves).
                raise errors.OffsetOutOfRange(
                    f"offset {self.position} is below the log start {resp.log_start_offset}",
                    earliest=resp.log_start_offset,
                    latest=resp.high_watermark,
                )
            if len(data) and self.position < resp.high_watermark:
                # One batch is bigger than what we asked for: ask for more.
                if self._fetch_bytes >= self._fetch_bytes_max:
                    raise errors.RecordTooLarge(
                        f"a batch at offset {self.position} is over {self._fetch_bytes_max} bytes"
                    )
                self._fetch_bytes = min(self._fetch_bytes * 2, self._fetch_bytes_max)
                continue
            if self.position >= resp.high_watermark and self.stop_at_end:
                return
            self._sleep(self._poll_s)

    def _fetch_from_start(self, query: int) -> protocol.Response:
        """The first fetch of a reader started by ``start`` or ``start_timestamp_ms``. The
        offset found may be deleted by retention before the fetch reaches it: asked for
        "the oldest" or "from a time", the reader asks again (at most a few times), where a
        reader given an offset gets OffsetOutOfRange."""
        for _ in range(START_RETRIES_MAX):
            self.position = self._list_offset(query)
            try:
                return self._fetch(self.position)
            except errors.OffsetOutOfRange:
                continue
        self.position = self._list_offset(query)
        return self._fetch(self.position)

    def _list_offset(self, timestamp_ms: int) -> int:
        """The leader's answer to LIST_OFFSETS for ``timestamp_ms`` (a time, or
        ``protocol.EARLIEST_TIMESTAMP``/``LATEST_TIMESTAMP``)."""
        resp = self._request(
            protocol.LIST_OFFSETS,
            lambda corr: protocol.list_offsets_request(
                corr, self.topic, self.partition, timestamp_ms
            ),
        )
        return resp.offset

    def _fetch(self, offset: int) -> protocol.Response:
        """One FETCH at ``offset`` from the leader, following leader changes."""
        return self._request(
            protocol.FETCH,
            lambda corr: protocol.fetch_request(
                corr, self.topic, self.partition, offset, self._fetch_bytes
            ),
        )

    def _request(self, api_key: int, build: Callable[[int], bytes]) -> protocol.Response:
        """One request to the leader, following leader changes; the answer when it is OK."""
        deadline = self._clock_ms() + self._retry_timeout_ms
        delay_s = 0.05
        while True:
            try:
                conn = self._connection()
                resp = conn.request(api_key, build)
                if resp.error_code == errors.NONE:
                    return resp
                if resp.error_code == errors.OffsetOutOfRange.code:
                    raise errors.OffsetOutOfRange(
                        resp.detail,
                        earliest=resp.log_start_offset,
                        latest=resp.high_watermark,
                    )
                exc = errors.error_for_code(resp.error_code, resp.detail, leader=resp.leader)
                raise exc
            except errors.PidleaseError as exc:
                retry = exc.retriable or isinstance(exc, errors.UnknownTopicOrPartition)
                self._drop_conn()
                if not retry or self._clock_ms() + delay_s * 1000 > deadline:
                    raise
                self._leader = None
                self._sleep(delay_s)
                delay_s = min(delay_s * 2, 1.0)

    def _connection(self) -> BlockingConnection:
        if self._conn is not None:
            return self._conn
        if self._leader is None:
            if self._client is None:
                self._client = LeaseClient(
                    self._coordinator_url,
                    request_timeout_ms=self._request_timeout_ms,
                    transport=self._http_transport,
                    api_token=self._api_token,
                    tls_ca_file=self._tls_ca_file,
                    tls=self._tls,
                )
            info = self._client.topic(self.topic, offsets=False)
            if not 0 <= self.partition < info.partitions:
                raise errors.ConfigError(
                    f"topic {self.topic!r} has partitions 0..{info.partitions - 1}, "
                    f"not {self.partition}"
                )
            self._leader = info.leader_address(self.partition)
            if not self._leader:
                raise errors.ServerUnavailable(
                    f"partition {self.partition} of {self.topic!r} has no live leader"
                )
        self._conn = BlockingConnection(
            self._leader, timeout_ms=self._request_timeout_ms, ssl_context=self._ssl
        )
        return self._conn

    def _drop_conn(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        self._drop_conn()
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _start_query(start: str | None, start_timestamp_ms: int | None) -> int | None:
    """The LIST_OFFSETS timestamp a start option asks with; None: start at ``start_offset``."""
    if start == "earliest":
        return protocol.EARLIEST_TIMESTAMP
    if start == "latest":
        return protocol.LATEST_TIMESTAMP
    return start_timestamp_ms
