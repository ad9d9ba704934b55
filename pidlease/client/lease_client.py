"""HTTP clients for the coordinator's JSON API (leases, topics, PIDs).

``AsyncLeaseClient`` (used by the producer) and ``LeaseClient`` (used by the reader, the
audit and the CLI) are thin shells over the same request builders and answer parsers,
httpx style. The coordinator's ``"error"`` names become ``pidlease.errors`` exceptions
here, and so do httpx's transport failures (as ``CoordinatorUnavailable``): nothing from
httpx leaks past this module. Tests pass an ``httpx.MockTransport`` as ``transport``.
When the coordinator requires an API token, pass ``api_token`` or set
``PIDLEASE_API_TOKEN``; it is sent as ``Authorization: Bearer <token>``. A token whose
principal lacks the scope, or a PID owned by another principal, raises ``Forbidden``
(403); a principal at its PID limit raises ``PidLimitExceeded`` (429). Neither is
retriable, so the producer fails with them instead of retrying.
An ``https://`` coordinator is verified against ``tls_ca_file`` (else ``PIDLEASE_TLS_CA_FILE``,
else the system trust store); a certificate it does not trust is ``Unauthorized``.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from typing import Any, Self

import httpx

from pidlease.errors import (
    ConfigError,
    CoordinatorUnavailable,
    InvalidRequest,
    PidleaseError,
    Unauthorized,
    describe,
    error_for_name,
)
from pidlease.wire.tls import client_ssl_context, find_cert_error

DEFAULT_COORDINATOR = "http://127.0.0.1:8470"
API_TOKEN_ENV = "PIDLEASE_API_TOKEN"  # noqa: S105 - the variable's name, not a secret
REQUEST_TIMEOUT_MS_DEFAULT = 30_000
# A batch lease call carries at most this many requests (the coordinator's default
# ``batch_requests_max``); ``lease_batch`` sends more as several calls, one after another.
BATCH_REQUESTS_MAX = 1000
# What one more partition may add to a lease call's HTTP timeout: a renewal round asks every
# partition's leader, and a takeover waits until every partition of the lease is fenced
# durably (a thousand partitions at R=3 took about 11 s on a loaded 2-core machine).
LEASE_MS_PER_PARTITION = 40


def lease_timeout_s(request_timeout_ms: float, partitions: int) -> float:
    """The HTTP timeout of a lease call that concerns ``partitions`` partitions."""
    return (request_timeout_ms + max(0, partitions - 1) * LEASE_MS_PER_PARTITION) / 1000


@dataclass(frozen=True, slots=True)
class Lease:
    """One answer of ``/v1/lease_pid``: the PID, its generation and token, and the next
    sequence this PID must send to the partition that was asked about."""

    topic: str
    partition: int
    pid: int
    generation: int
    sequence_number: int
    expire_ms: int
    expires_at_ms: int
    lease_token: str


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    partition: int
    leader: int | None
    leader_address: str | None
    leader_epoch: int = 0
    replicas: list[int] = field(default_factory=list)
    isr: list[int] = field(default_factory=list)
    log_end_offset: int = -1
    high_watermark: int = -1


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    partitions: int
    replication_factor: int
    dedup: str
    partition_states: list[PartitionInfo]

    def leader_address(self, partition: int) -> str | None:
        for p in self.partition_states:
            if p.partition == partition:
                return p.leader_address or None
        return None


def lease_request(
    topic: str,
    partition: int,
    pid: int,
    *,
    generation: int | None = None,
    producer_name: str | None = None,
    expire_ms: int | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"topic": topic, "partition": partition, "pid": pid}
    if generation is not None:
        body["generation"] = generation
    if producer_name is not None:
        body["producer_name"] = producer_name
    if expire_ms is not None:
        body["expire_ms"] = expire_ms
    return body


def _check(body: dict[str, Any]) -> dict[str, Any]:
    """Raise the error an answer carries, else return it."""
    name = body.get("error", "NONE")
    if name != "NONE":
        extra = {k: v for k, v in body.items() if k not in ("error", "detail")}
        raise error_for_name(str(name), str(body.get("detail") or name), **extra)
    return body


def _decode(resp: httpx.Response) -> dict[str, Any]:
    try:
        body = resp.json()
    except ValueError:
        body = None
    if not isinstance(body, dict) or "error" not in body:
        if resp.status_code >= 500:
            raise CoordinatorUnavailable(f"coordinator answered HTTP {resp.status_code}; retry")
        if resp.status_code >= 400:
            raise InvalidRequest(f"coordinator answered HTTP {resp.status_code}: {resp.text[:200]}")
        raise CoordinatorUnavailable(
            f"coordinator answered HTTP {resp.status_code} without a JSON error field"
        )
    return body


def parse_lease(body: dict[str, Any], topic: str, partition: int) -> Lease:
    _check(body)
    try:
        return Lease(
            topic,
            partition,
            int(body["pid"]),
            int(body["generation"]),
            int(body["sequence_number"]),
            int(body["expire_ms"]),
            int(body["expires_at_ms"]),
            str(body["lease_token"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CoordinatorUnavailable(f"lease answer lacks a field: {exc}") from exc


def parse_batch(
    body: dict[str, Any], requests: list[dict[str, Any]]
) -> list[Lease | PidleaseError]:
    """One Lease or error per request, in order."""
    _check(body)
    answers = body.get("responses")
    if not isinstance(answers, list) or len(answers) != len(requests):
        raise CoordinatorUnavailable("batch lease answer does not hold one response per request")
    out: list[Lease | PidleaseError] = []
    for req, ans in zip(requests, answers, strict=True):
        try:
            out.append(parse_lease(ans, req["topic"], req["partition"]))
        except PidleaseError as exc:
            out.append(exc)
    return out


def _topic_path(name: str, offsets: bool) -> str:
    return f"/v1/topics/{name}" if offsets else f"/v1/topics/{name}?offsets=false"


def parse_topic(body: dict[str, Any]) -> TopicInfo:
    _check(body)
    try:
        states = [
            PartitionInfo(
                int(p["partition"]),
                p.get("leader"),
                p.get("leader_address"),
                int(p.get("leader_epoch", 0)),
                list(p.get("replicas", [])),
                list(p.get("isr", [])),
                int(p.get("log_end_offset", -1)),
                int(p.get("high_watermark", -1)),
            )
            for p in body.get("partition_states", [])
        ]
        return TopicInfo(
            str(body["name"]),
            int(body["partitions"]),
            int(body.get("replication_factor", 1)),
            str(body.get("dedup", "strict")),
            states,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CoordinatorUnavailable(f"topic answer lacks a field: {exc}") from exc


def _headers(api_token: str | None) -> dict[str, str]:
    # The coordinator wants "Authorization: Bearer <token>" on /v1 calls when it has one.
    token = api_token if api_token is not None else os.environ.get(API_TOKEN_ENV, "")
    return {"authorization": f"Bearer {token}"} if token else {}


def coordinator_base_url(url: object) -> str:
    """``url`` checked and without its trailing slash. A URL httpx cannot send to is a
    mistake in the caller's settings: it raises ``ConfigError`` here rather than
    ``CoordinatorUnavailable`` (retried until a start timeout) at the first request."""
    if not isinstance(url, str):
        raise ConfigError(f"coordinator URL must be a str, not {type(url).__name__}")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise ConfigError(f"coordinator URL {url!r} is malformed: {exc}") from exc
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigError(
            f"coordinator URL {url!r} needs http:// or https:// and a host, "
            f"e.g. {DEFAULT_COORDINATOR}"
        )
    return url.rstrip("/")


def _verify(base_url: str, tls_ca_file: str | None, tls: bool) -> ssl.SSLContext | bool:
    # httpx's verify: our context for https (CA file, or env), else its own default.
    if not base_url.lower().startswith("https://"):
        return True
    return client_ssl_context(tls_ca_file, tls) or True


def _transport_error(base_url: str, exc: Exception) -> PidleaseError:
    cert = find_cert_error(exc)
    if cert is not None:  # retrying cannot help: not retriable
        return Unauthorized(
            f"TLS certificate verification of the coordinator at {base_url} failed: "
            f"{cert.verify_message or cert} (is tls_ca_file the CA that signed it?)"
        )
    return CoordinatorUnavailable(
        f"cannot reach the coordinator at {base_url}: {describe(exc)}; is it running?"
    )


class AsyncLeaseClient:
    """The coordinator's API for asyncio code."""

    def __init__(
        self,
        base_url: str = DEFAULT_COORDINATOR,
        *,
        request_timeout_ms: int = REQUEST_TIMEOUT_MS_DEFAULT,
        transport: httpx.AsyncBaseTransport | None = None,
        api_token: str | None = None,
        tls_ca_file: str | None = None,
        tls: bool = False,
    ) -> None:
        self.base_url = coordinator_base_url(base_url)
        self._request_timeout_ms = request_timeout_ms
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=request_timeout_ms / 1000,
            transport=transport,
            headers=_headers(api_token),
            verify=_verify(self.base_url, tls_ca_file, tls),
        )

    async def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        partitions: int = 1,
    ) -> dict[str, Any]:
        timeout = lease_timeout_s(self._request_timeout_ms, partitions)
        try:
            resp = await self._http.request(method, path, json=body, timeout=timeout)
        except httpx.HTTPError as exc:
            raise _transport_error(self.base_url, exc) from exc
        return _decode(resp)

    async def lease(
        self,
        topic: str,
        partition: int,
        pid: int,
        *,
        generation: int | None = None,
        producer_name: str | None = None,
        expire_ms: int | None = None,
        partitions: int = 1,
    ) -> Lease:
        """``partitions``: how many partitions the PID may hold (a takeover fences every
        one before it answers); the call's timeout grows with it."""
        req = lease_request(
            topic,
            partition,
            pid,
            generation=generation,
            producer_name=producer_name,
            expire_ms=expire_ms,
        )
        body = await self._call("POST", "/v1/lease_pid", req, partitions=partitions)
        return parse_lease(body, topic, partition)

    async def lease_batch(self, requests: list[dict[str, Any]]) -> list[Lease | PidleaseError]:
        """One answer per request, in order. More than ``BATCH_REQUESTS_MAX`` requests go as
        several calls, one after another; each call's timeout grows with its size."""
        out: list[Lease | PidleaseError] = []
        for i in range(0, len(requests), BATCH_REQUESTS_MAX):
            chunk = requests[i : i + BATCH_REQUESTS_MAX]
            body = await self._call(
                "POST", "/v1/lease_pid/batch", {"requests": chunk}, partitions=len(chunk)
            )
            out.extend(parse_batch(body, chunk))
        return out

    async def topic(self, name: str, *, offsets: bool = True) -> TopicInfo:
        """The topic's partitions; ``offsets=False``: leaders and replicas from ZooKeeper
        only (fast, never held up by a partition server that does not answer)."""
        return parse_topic(_check(await self._call("GET", _topic_path(name, offsets))))

    async def close(self) -> None:
        await self._http.aclose()


class LeaseClient:
    """The coordinator's API for blocking code (reader, audit, CLI)."""

    def __init__(
        self,
        base_url: str = DEFAULT_COORDINATOR,
        *,
        request_timeout_ms: int = REQUEST_TIMEOUT_MS_DEFAULT,
        transport: httpx.BaseTransport | None = None,
        api_token: str | None = None,
        tls_ca_file: str | None = None,
        tls: bool = False,
    ) -> None:
        self.base_url = coordinator_base_url(base_url)
        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=request_timeout_ms / 1000,
            transport=transport,
            headers=_headers(api_token),
            verify=_verify(self.base_url, tls_ca_file, tls),
        )

    def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Any API call; raises the error the answer carries."""
        try:
            resp = self._http.request(method, path, json=body, params=params)
        except httpx.HTTPError as exc:
            raise _transport_error(self.base_url, exc) from exc
        return _check(_decode(resp))

    def lease(
        self,
        topic: str,
        partition: int,
        pid: int,
        *,
        generation: int | None = None,
        producer_name: str | None = None,
        expire_ms: int | None = None,
    ) -> Lease:
        req = lease_request(
            topic,
            partition,
            pid,
            generation=generation,
            producer_name=producer_name,
            expire_ms=expire_ms,
        )
        try:
            resp = self._http.post("/v1/lease_pid", json=req)
        except httpx.HTTPError as exc:
            raise _transport_error(self.base_url, exc) from exc
        return parse_lease(_decode(resp), topic, partition)

    def topic(self, name: str, *, offsets: bool = True) -> TopicInfo:
        """As ``AsyncLeaseClient.topic``."""
        return parse_topic(self.call("GET", _topic_path(name, offsets)))

    def topics(self) -> list[dict[str, Any]]:
        body = self.call("GET", "/v1/topics")
        topics = body.get("topics", [])
        return [t if isinstance(t, dict) else {"name": t} for t in topics]

    def create_topic(
        self,
        name: str,
        *,
        partitions: int,
        replication_factor: int | None = 1,
        dedup: str = "strict",
        **settings: int,
    ) -> dict[str, Any]:
        """``settings``: any of the log settings (``retention_ms``, ``retention_bytes``,
        ``segment_bytes``, ``segment_ms``, ``min_insync_replicas``); left out, the
        coordinator's defaults. The coordinator checks names and ranges.
        ``replication_factor=None``: the coordinator's ``topic_replication_factor_default``."""
        body: dict[str, Any] = {"name": name, "partitions": partitions, "dedup": dedup}
        if replication_factor is not None:
            body["replication_factor"] = replication_factor
        return self.call("POST", "/v1/topics", {**body, **settings})

    def alter_topic(self, name: str, **settings: int) -> dict[str, Any]:
        """Change some of a topic's log settings (names as for ``create_topic``); the
        others keep their values. Answers the settings as stored afterwards."""
        return self.call("PATCH", f"/v1/topics/{name}", settings)

    def pids(self, *, limit: int = 1000) -> list[dict[str, Any]]:
        return list(self.call("GET", "/v1/pids", params={"limit": limit}).get("pids", []))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
