"""The lease service: carries out ``lease_pid`` requests around the pure rules of
``leases.py``, with the PID allocator, the ZooKeeper store and the partition leaders.

Every change of a PID record is a compare-and-set on its znode version, retried on
conflict with a fresh read, so concurrent coordinators (or threads) never lose an update
and two takeovers never get the same generation. A takeover answers only after the leader
of every partition in the PID's record has durably recorded the new generation (FENCE).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from coordinator import leases
from coordinator.allocator import PidAllocator
from coordinator.auth import ANONYMOUS, Principal
from coordinator.leaders import LeaderClient, many_timeout_s
from coordinator.lease_cache import AddressCache, RecordCache
from coordinator.leases import LeaseKind, LeaseRequest
from coordinator.metrics import Metrics
from coordinator.settings import CoordinatorSettings
from coordinator.store import Store
from pidlease import errors
from pidlease.errors import (
    CoordinatorUnavailable,
    Forbidden,
    PidleaseError,
    PidLimitExceeded,
    ProducerFenced,
    UnknownPid,
    UnknownTopicOrPartition,
)
from pidlease.wire.cluster import PidRecord, TopicSpec, split_tp_key, tp_key
from pidlease.wire.protocol import (
    FENCE_CREATE_IF_ABSENT,
    PARTITIONS_PER_REQUEST_MAX,
    PartitionEntry,
    Response,
)
from pidlease.wire.token import make_token

log = logging.getLogger("coordinator.service")

GENERATION_START_MAX = 2**30


def wall_clock_ms() -> int:
    # Wall clock, not monotonic: expiries are absolute times shared with partition servers.
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class LeaseResult:
    kind: LeaseKind
    record: PidRecord
    sequence_number: int
    lease_token: str

    def to_json(self) -> dict[str, Any]:
        return {
            "error": "NONE",
            "pid": self.record.pid,
            "generation": self.record.generation,
            "sequence_number": self.sequence_number,
            "expire_ms": self.record.expire_ms,
            "expires_at_ms": self.record.expires_at_ms,
            "lease_token": self.lease_token,
            "kind": self.kind.value,
            "producer_name": self.record.producer_name,
        }


def _seen(record: PidRecord, tp: str) -> bool:
    return bool(record.partitions.get(tp, {}).get("seen", False))


def _leader_state(resp: Response) -> leases.LeaderState:
    return leases.LeaderState(resp.found, resp.durable_highwater, resp.dropped_last_use_max_ms)


def _round_key(req: LeaseRequest) -> tuple[int, int, str | None, int | None] | None:
    """Requests with the same key renew the same PID the same way (one renewal round)."""
    if req.pid == leases.NEW_PID or req.generation is None:
        return None
    return (req.pid, req.generation, req.producer_name, req.expire_ms)


class LeaseService:
    def __init__(
        self,
        settings: CoordinatorSettings,
        store: Store,
        allocator: PidAllocator,
        leaders: LeaderClient,
        metrics: Metrics,
        *,
        clock_ms: Callable[[], int] = wall_clock_ms,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.allocator = allocator
        self.leaders = leaders
        self.metrics = metrics
        self.clock_ms = clock_ms
        self._rng = rng or random.SystemRandom()
        self.limits = leases.ExpiryLimits(
            default_ms=settings.lease_expire_ms_default,
            min_ms=settings.lease_expire_ms_min,
            max_ms=settings.lease_expire_ms_max,
            retention_ms=settings.pid_retention_ms,
            expiring_window_ms=settings.lease_expiring_window_ms,
        )
        # Topics are never deleted, so a spec once read stays true.
        self._topics: dict[str, TopicSpec] = {}
        self.records = RecordCache(settings.pid_record_cache_max)
        self.addresses = AddressCache(settings.leader_address_cache_ms)
        self._pool = ThreadPoolExecutor(
            max_workers=settings.fence_parallelism_max, thread_name_prefix="leader-call"
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- entry points ----------------------------------------------------------------------
    def lease(self, req: LeaseRequest, principal: Principal = ANONYMOUS) -> LeaseResult:
        started = time.perf_counter()
        try:
            # (the one-argument call keeps ``_lease`` replaceable by a plain function in tests)
            result = self._lease(req) if principal is ANONYMOUS else self._lease(req, principal)
        except PidleaseError:
            # The error itself is counted where it is answered (app.py), once.
            self.metrics.lease_failed(time.perf_counter() - started)
            raise
        self.metrics.lease_done(result.kind.value, time.perf_counter() - started)
        return result

    def lease_batch(
        self, reqs: list[LeaseRequest], principal: Principal = ANONYMOUS
    ) -> list[dict[str, Any]]:
        """In request order, so a batch may rely on an earlier item's effect. A run of
        consecutive renewals of one PID (same pid, generation, name and expire_ms: what the
        SDK's lease keeper sends for all its partitions) is one renewal round: one write of
        the PID record for the whole run (``_renew_round``)."""
        out: list[dict[str, Any]] = []
        i = 0
        while i < len(reqs):
            key = _round_key(reqs[i])
            j = i + 1
            while key is not None and j < len(reqs) and _round_key(reqs[j]) == key:
                j += 1
            if j - i > 1:
                out.extend(self._renew_round(reqs[i:j], principal))
            else:
                out.append(self._batch_item(reqs[i], principal))
            i = j
        return out

    def _batch_item(self, req: LeaseRequest, principal: Principal) -> dict[str, Any]:
        try:
            return self.lease(req, principal).to_json()
        except PidleaseError as exc:
            return exc.to_json()
        except Exception as exc:
            log.exception("unexpected error in a batch item")
            return CoordinatorUnavailable(
                f"internal error ({type(exc).__name__}); it was logged; retry"
            ).to_json()

    def _renew_round(self, reqs: list[LeaseRequest], principal: Principal) -> list[dict[str, Any]]:
        """Renew one PID on every partition of ``reqs`` with one compare-and-set of its
        record: the leaders are asked in parallel (once, reused if the write must be
        retried), each item gets its own answer, and the record gets every partition that
        succeeded (``leases.renewed_round``). Whatever is not a plain renewal (the record
        is gone, fenced, owned by another principal, ...) is answered item by item through
        ``lease``, exactly as before."""
        started = time.perf_counter()
        first = reqs[0]
        pid = first.pid
        answers: list[dict[str, Any] | None] = [None] * len(reqs)
        for k, req in enumerate(reqs):
            try:
                spec = self.topic(req.topic, req.partition)
                if req.partition >= spec.partitions:
                    raise UnknownTopicOrPartition(
                        f"topic {req.topic!r} has partitions 0..{spec.partitions - 1}, "
                        f"not {req.partition}"
                    )
            except PidleaseError as exc:
                self.metrics.lease_failed(time.perf_counter() - started)
                answers[k] = exc.to_json()
        todo = [k for k in range(len(reqs)) if answers[k] is None]
        states: dict[str, leases.LeaderState | PidleaseError] = {}
        checked_ms = 0
        got: tuple[PidRecord, int] | None = None
        cache_allowed = True
        for attempt in range(self.settings.cas_attempts_max):
            from_cache = False
            if got is None and cache_allowed:
                cache_allowed = False
                got = self.records.get(pid)
                from_cache = got is not None
            if got is None:
                got = self.store.get_pid(pid)
                if got is None:
                    self.records.drop(pid)
            record, version = got or (None, -1)
            now = self.clock_ms()
            try:
                if record is None or not leases.retained(record, now, self.limits.retention_ms):
                    raise UnknownPid("decided item by item")
                self._check_owner(record, principal)
                kind = leases.classify(first, record, now, self.limits)
            except PidleaseError:
                if from_cache:
                    got = None
                    continue
                kind = None
            if kind is not LeaseKind.RENEW or record is None:
                # Not a plain renewal: each item decides (and is counted, and logged) alone.
                for k in todo:
                    answers[k] = self._batch_item(reqs[k], principal)
                return [a for a in answers if a is not None]
            missing = sorted({reqs[k].tp for k in todo} - set(states))
            if missing:
                checked_ms = self.clock_ms()
                states.update(self._leader_states(missing, pid))
            results: dict[int, int | PidleaseError] = {}
            ok: dict[str, leases.LeaderState] = {}
            for k in todo:
                tp = reqs[k].tp
                st = states[tp]
                try:
                    if isinstance(st, PidleaseError):
                        raise st
                    results[k] = leases.renew_sequence(
                        record, tp, st, self.settings.clock_skew_max_ms
                    )
                    ok[tp] = st
                except PidleaseError as exc:
                    results[k] = exc
            updated = record
            if ok:
                updated = leases.renewed_round(
                    record, first.expire_ms, ok, now, checked_ms, self.limits
                )
                if not self.store.cas_pid(updated, version):
                    got = None
                    if not from_cache:
                        time.sleep(self._rng.uniform(0, min(0.05, 0.001 * (attempt + 1))))
                    continue
                self.records.put(updated, version + 1)
            token = self._token(updated)
            latency = time.perf_counter() - started
            for k, res in results.items():
                if isinstance(res, PidleaseError):
                    self.metrics.lease_failed(latency)
                    answers[k] = res.to_json()
                else:
                    self.metrics.lease_done(LeaseKind.RENEW.value, latency)
                    answers[k] = LeaseResult(LeaseKind.RENEW, updated, res, token).to_json()
            return [a for a in answers if a is not None]
        busy = CoordinatorUnavailable(f"pid {pid} is contended; retry")
        for k in todo:
            self.metrics.lease_failed(time.perf_counter() - started)
            answers[k] = busy.to_json()
        return [a for a in answers if a is not None]

    def _leader_states(
        self, tps: list[str], pid: int
    ) -> dict[str, leases.LeaderState | PidleaseError]:
        """PRODUCER_STATE of ``pid`` on each of ``tps``: one PRODUCER_STATES request per
        leader server for all the partitions it leads, the leaders asked in parallel
        (issue 24). A partition whose leader answered NOT_LEADER (or was not reached) is
        asked again once, on a fresh ZooKeeper read of its leader, as a lone renewal's
        call is; a failure after that is that partition's answer."""
        out: dict[str, leases.LeaderState | PidleaseError] = {}
        todo = list(tps)
        for attempt in (0, 1):
            if attempt:
                for tp in todo:
                    self.addresses.drop(tp)  # stale (leader moved or down): ask ZooKeeper
            # Read from the cache once: an entry may expire while the others are looked up
            # (seconds for thousands of partitions on a loaded machine), and a second read
            # then found neither an address nor an answer for it (KeyError, an HTTP 500).
            known = {tp: self.addresses.get(tp) for tp in todo}
            unknown = [tp for tp, address in known.items() if address is None]
            if unknown:
                # One pipelined ZooKeeper read for all of them, not one per partition.
                try:
                    looked_up = self._leader_lookup(unknown)
                except PidleaseError as exc:  # ZooKeeper unavailable: each item's answer
                    looked_up = dict.fromkeys(unknown, exc)
                for tp in unknown:
                    found = looked_up.get(tp, CoordinatorUnavailable(f"no leader found for {tp}"))
                    if isinstance(found, str):
                        self.addresses.put(tp, found)
                        known[tp] = found
                    else:
                        out[tp] = found
            by_leader: dict[str, list[str]] = {}
            for tp in todo:
                address = known.get(tp)
                if address is not None:
                    by_leader.setdefault(address, []).append(tp)
                elif tp not in out:
                    out[tp] = CoordinatorUnavailable(f"no leader address for {tp}; retry")
            retry: list[str] = []
            for tp, got in self._per_leader(
                by_leader,
                lambda address, chunk: self.leaders.producer_states(
                    address, pid, [split_tp_key(tp) for tp in chunk]
                ),
                "PRODUCER_STATES",
            ).items():
                if isinstance(got, Response) and got.error_code == errors.NONE:
                    out[tp] = _leader_state(got)
                    continue
                retry.append(tp)
                out[tp] = (
                    got
                    if isinstance(got, PidleaseError)
                    # The topic exists in ZooKeeper, so NOT_LEADER or an unknown partition
                    # on the server is a transition (leader moving, server still
                    # loading): retriable.
                    else CoordinatorUnavailable(
                        f"leader of {tp} answered PRODUCER_STATE with "
                        f"{errors.error_for_code(got.error_code).name}: {got.detail}"
                    )
                )
            todo = retry
            if not todo:
                break
        return out

    def _per_leader(
        self,
        by_leader: dict[str, list[str]],
        call: Callable[[str, list[str]], list[Response]],
        what: str,
    ) -> dict[str, Response | PidleaseError]:
        """``call(address, partitions)`` for each leader and its partitions (split into
        requests of at most ``PARTITIONS_PER_REQUEST_MAX``), all in parallel on the
        shared pool: each partition's answer, or the error its request failed with."""
        futures: list[tuple[list[str], Future[list[Response]]]] = []
        longest = 0
        for address, tps in by_leader.items():
            for i in range(0, len(tps), PARTITIONS_PER_REQUEST_MAX):
                chunk = tps[i : i + PARTITIONS_PER_REQUEST_MAX]
                longest = max(longest, len(chunk))
                futures.append((chunk, self._pool.submit(call, address, chunk)))
        # One deadline for all: past it, calls not started yet are cancelled (their
        # partitions answer COORDINATOR_UNAVAILABLE, retriable), so a slow leader cannot
        # hold the shared pool for a whole queue of calls.
        timeout_s = many_timeout_s(self.settings.leader_request_timeout_ms / 1000, longest)
        deadline = time.monotonic() + timeout_s * 2
        out: dict[str, Response | PidleaseError] = {}
        for chunk, fut in futures:
            try:
                got = fut.result(timeout=max(0.0, deadline - time.monotonic()))
                out.update(zip(chunk, got, strict=True))
            except PidleaseError as exc:
                out.update(dict.fromkeys(chunk, exc))
            except Exception as exc:  # noqa: BLE001 - a pool timeout or a bug in one call
                fut.cancel()
                failed = CoordinatorUnavailable(
                    f"{what} to the leader of {chunk[0]} failed: {exc!r}"
                )
                out.update(dict.fromkeys(chunk, failed))
        return out

    def topic(self, name: str, partition: int = 0) -> TopicSpec:
        """The topic's spec, cached; read again when ``partition`` is beyond the cached
        count (partitions added since, by CreatePartitions on a partition server or by
        another coordinator: a cached count would refuse them for good)."""
        spec = self._topics.get(name)
        if spec is None or partition >= spec.partitions:
            spec = self.store.get_topic(name)
            if spec is None:
                raise UnknownTopicOrPartition(f"topic {name!r} does not exist")
            self._topics[name] = spec
        return spec

    # -- the three kinds -------------------------------------------------------------------
    def _lease(self, req: LeaseRequest, principal: Principal = ANONYMOUS) -> LeaseResult:
        spec = self.topic(req.topic, req.partition)
        if req.partition >= spec.partitions:
            raise UnknownTopicOrPartition(
                f"topic {req.topic!r} has partitions 0..{spec.partitions - 1}, not {req.partition}"
            )
        if req.pid != leases.NEW_PID:
            return self._change(req, req.pid, None, principal)
        if req.producer_name is None:
            leases.classify(req, None, self.clock_ms(), self.limits)  # rejects a stray generation
            result = self._new(req, None, None, principal)
            assert result is not None
            return result
        return self._by_name(req, req.producer_name, principal)

    def _by_name(self, req: LeaseRequest, name: str, principal: Principal) -> LeaseResult:
        for _ in range(self.settings.cas_attempts_max):
            bound = self.store.get_name(name)
            if bound is None:
                result = self._new(req, name, None, principal)
            else:
                pid, name_version = bound
                got = self.store.get_pid(pid)
                record = got[0] if got else None
                kind = leases.classify(req, record, self.clock_ms(), self.limits)
                if kind is LeaseKind.NEW:
                    result = self._new(req, name, name_version, principal)
                else:
                    by_pid = LeaseRequest(req.topic, req.partition, pid, req.expire_ms, None, name)
                    try:
                        return self._change(by_pid, pid, got, principal)
                    except UnknownPid:
                        # Swept meanwhile: the name is free to rebind. Any other UNKNOWN_PID
                        # (a partition lost the PID's state) is the answer; retrying would
                        # only raise the generation again and again.
                        if self._still_retained(pid):
                            raise
                        continue
            if result is not None:
                return result
        raise CoordinatorUnavailable(f"producer_name {name!r} is contended; retry")

    def _still_retained(self, pid: int) -> bool:
        got = self.store.get_pid(pid)
        now = self.clock_ms()
        return got is not None and leases.retained(got[0], now, self.limits.retention_ms)

    def _new(
        self,
        req: LeaseRequest,
        name: str | None,
        name_version: int | None = None,
        principal: Principal = ANONYMOUS,
    ) -> LeaseResult | None:
        """A fresh PID from the block with a random generation; sequence 0 without asking
        any server (nobody can have written with a PID that did not exist). None when the
        name was bound by someone else meanwhile (the caller re-reads it)."""
        if self.settings.pids_max_per_principal > 0:
            return self._new_counted(req, name, name_version, principal)
        pid = self.allocator.next_pid()
        generation = self._rng.randrange(GENERATION_START_MAX)
        record = leases.new_record(
            req, pid, generation, self.clock_ms(), self.limits, owner=principal.name
        )
        if name is None:
            self.store.create_pid(record)
        elif not self.store.create_named_pid(record, name, name_version):
            return None
        self.records.put(record, 0)
        return LeaseResult(LeaseKind.NEW, record, 0, self._token(record))

    def _new_counted(
        self, req: LeaseRequest, name: str | None, name_version: int | None, principal: Principal
    ) -> LeaseResult | None:
        """``_new`` under ``pids_max_per_principal``: the record and the owner's count + 1
        are one ZooKeeper transaction, with a compare-and-set on the count, so concurrent
        coordinators never pass the limit and a crash leaves no count without its PID."""
        limit = self.settings.pids_max_per_principal
        record: PidRecord | None = None
        for attempt in range(self.settings.cas_attempts_max):
            counted = self.store.get_principal_count(principal.name)
            if counted is None:  # first counted PID: start from the PIDs it already owns
                count, version = self.store.count_owned_pids(principal.name), None
            else:
                count, version = counted
            if count >= limit:
                raise PidLimitExceeded(
                    f"principal {principal.name!r} holds {count} PIDs and the limit "
                    f"(pids_max_per_principal) is {limit}: reuse producer names (a lease with a "
                    "known producer_name takes its PID over and does not count), or wait until "
                    "old PIDs are pid_retention_ms past their lease and swept",
                    principal=principal.name,
                    count=count,
                    limit=limit,
                )
            if record is None:
                pid = self.allocator.next_pid()
                record = leases.new_record(
                    req,
                    pid,
                    self._rng.randrange(GENERATION_START_MAX),
                    self.clock_ms(),
                    self.limits,
                    owner=principal.name,
                )
            outcome = self.store.create_pid_counted(
                record, name, name_version, principal.name, count + 1, version
            )
            if outcome == "ok":
                self.records.put(record, 0)
                return LeaseResult(LeaseKind.NEW, record, 0, self._token(record))
            if outcome == "name":
                return None
            time.sleep(self._rng.uniform(0, min(0.05, 0.001 * (attempt + 1))))
        raise CoordinatorUnavailable(
            f"the PID count of principal {principal.name!r} is contended; retry"
        )

    def _change(
        self,
        req: LeaseRequest,
        pid: int,
        got: tuple[PidRecord, int] | None,
        principal: Principal = ANONYMOUS,
    ) -> LeaseResult:
        """Renew or take over ``pid``: compare-and-set loop on its record. The first try may
        use the record this coordinator cached (lease_cache.py); anything it decides is
        either confirmed by the compare-and-set or decided again on a fresh read."""
        state: Response | None = None
        checked_ms = 0  # when ``state`` was asked for
        cache_allowed = got is None
        for attempt in range(self.settings.cas_attempts_max):
            from_cache = False
            if got is None and cache_allowed:
                cache_allowed = False
                got = self.records.get(pid)
                from_cache = got is not None
            if got is None:
                got = self.store.get_pid(pid)
                if got is None:
                    self.records.drop(pid)
            record, version = got or (None, -1)
            now = self.clock_ms()
            try:
                if record is not None and leases.retained(record, now, self.limits.retention_ms):
                    self._check_owner(record, principal)
                kind = leases.classify(req, record, now, self.limits)
                assert record is not None
                updated = leases.apply(kind, record, req, now, self.limits)
            except PidleaseError:
                if from_cache:
                    got = None
                    continue
                raise
            if kind is LeaseKind.RENEW:
                # Read-only leader call, done once and reused if the write must be retried.
                if state is None:
                    checked_ms = self.clock_ms()
                    state = self._producer_state(req.topic, req.partition, pid)
                answer = _leader_state(state)
                seq = leases.renew_sequence(record, req.tp, answer, self.settings.clock_skew_max_ms)
                updated = leases.renewed_round(
                    record, req.expire_ms, {req.tp: answer}, now, checked_ms, self.limits
                )
                if self.store.cas_pid(updated, version):
                    self.records.put(updated, version + 1)
                    return LeaseResult(kind, updated, seq, self._token(updated))
            elif self.store.cas_pid(updated, version):
                self.records.put(updated, version + 1)
                return self._fence_all(req, updated, record)
            got = None
            if from_cache:
                continue  # the cached record was stale: read it fresh, no back-off
            # Back off a little under contention so the winner's write is not starved.
            time.sleep(self._rng.uniform(0, min(0.05, 0.001 * (attempt + 1))))
        raise CoordinatorUnavailable(f"pid {pid} is contended; retry")

    @staticmethod
    def _check_owner(record: PidRecord, principal: Principal) -> None:
        owner = leases.owner_of(record)
        if not principal.is_admin and owner != principal.name:
            raise Forbidden(
                f"pid {record.pid} belongs to principal {owner!r}, not "
                f"{principal.name!r}; a producer principal may use only the PIDs it "
                "leased (an admin may take any over)",
                principal=principal.name,
            )

    # -- takeover fencing ------------------------------------------------------------------
    def _fence_all(self, req: LeaseRequest, record: PidRecord, prior: PidRecord) -> LeaseResult:
        """Fence every partition of ``record`` (just written; ``prior`` is the record it
        replaced, which says since when each partition was leased)."""
        token = self._token(record)
        tps = sorted(record.partitions)
        addresses = self._leader_addresses(tps)
        since = {tp: leases.leased_since(prior, tp, self.settings.clock_skew_max_ms) for tp in tps}
        by_leader: dict[str, list[str]] = {}
        for tp in tps:
            by_leader.setdefault(addresses[tp], []).append(tp)

        def fence(address: str, chunk: list[str]) -> list[Response]:
            entries = []
            for tp in chunk:
                topic, p = split_tp_key(tp)
                flags = 0 if _seen(record, tp) else FENCE_CREATE_IF_ABSENT
                entries.append(PartitionEntry(topic, p, flags, since[tp]))
            return self.leaders.fences(address, record.pid, record.generation, token, entries)

        # One FENCES request per leader server for all the partitions it leads (issue 24).
        self.metrics.fences(len(tps))
        answers: dict[str, Response] = {}
        failure: PidleaseError | None = None
        for tp, got in self._per_leader(by_leader, fence, "FENCES").items():
            if isinstance(got, PidleaseError):
                failure = failure or got
            else:
                answers[tp] = got
        if failure is not None:
            # The new generation is in ZooKeeper; a retried takeover raises it again and
            # re-fences every partition, so nothing is left half-done for the producer.
            raise failure
        highwaters: dict[str, int] = {}
        fenced: dict[str, leases.FenceAnswer] = {}
        for tp, resp in answers.items():
            if resp.error_code == errors.NONE:
                fenced[tp] = leases.FenceAnswer(
                    existed=resp.existed,
                    created=not resp.existed and resp.fence_offset >= 0,
                    durable_highwater=resp.durable_highwater,
                    dropped_last_use_max_ms=resp.dropped_last_use_max_ms,
                )
                if resp.existed and resp.durable_highwater >= 0:
                    highwaters[tp] = resp.durable_highwater
                continue
            if resp.error_code == ProducerFenced.code:
                raise ProducerFenced(
                    f"takeover of pid {record.pid} got generation {record.generation}, but "
                    f"partition {tp} already holds a newer one (a concurrent takeover won)",
                    generation=record.generation,
                )
            if resp.error_code == UnknownPid.code:
                continue  # no state there and none created: not fenced (judged below)
            raise CoordinatorUnavailable(
                f"leader of {tp} refused FENCE: {errors.error_for_code(resp.error_code).name} "
                f"{resp.detail}"
            )
        untracked = [tp for tp in tps if self.topic(split_tp_key(tp)[0]).dedup == "off"]
        seq = leases.takeover_sequence(record, req.tp, fenced, since, untracked)
        if highwaters:
            record = self._remember_highwaters(record, highwaters)
        return LeaseResult(LeaseKind.TAKEOVER, record, seq, self._token(record))

    def _remember_highwaters(self, record: PidRecord, highwaters: dict[str, int]) -> PidRecord:
        """Mark partitions seen after a takeover's fences. Best effort: "seen" only makes a
        later lease stricter, so losing this write to a newer change is harmless."""
        target = record
        got: tuple[PidRecord, int] | None = None
        for _ in range(10):
            got = got or self.store.get_pid(record.pid)
            if got is None:
                break
            current, version = got
            updated = current
            for tp, hw in highwaters.items():
                if tp in updated.partitions:
                    updated = leases.mark_seen(updated, tp, hw)
            if updated == current or self.store.cas_pid(updated, version):
                self.records.drop(record.pid)
                if current.generation == record.generation:
                    target = updated
                break
            got = None
        return target

    # -- leaders ---------------------------------------------------------------------------
    def _leader_addresses(self, tps: list[str]) -> dict[str, str]:
        out = {}
        for tp, found in self._leader_lookup(tps).items():
            if isinstance(found, PidleaseError):
                raise found
            out[tp] = found
        return out

    def _leader_lookup(self, tps: list[str]) -> dict[str, str | PidleaseError]:
        """Each partition's leader address, from one pipelined read of the partitions'
        states and one of their leaders' entries; or why there is none."""
        keys = [split_tp_key(tp) for tp in tps]
        states = {}
        out: dict[str, str | PidleaseError] = {}
        for topic in {t for t, _ in keys}:
            parts = [p for t, p in keys if t == topic]
            for p, st in zip(parts, self.store.get_partition_states(topic, parts), strict=True):
                if st is None:
                    out[tp_key(topic, p)] = UnknownTopicOrPartition(
                        f"partition {tp_key(topic, p)} does not exist"
                    )
                else:
                    states[tp_key(topic, p)] = st
        servers = self.store.get_servers(sorted({st.leader for st in states.values()}))
        for tp, st in states.items():
            info = servers.get(st.leader)
            out[tp] = (
                info.address
                if info is not None
                else CoordinatorUnavailable(
                    f"leader {st.leader} of partition {tp} is not live; retry"
                )
            )
        return out

    def _producer_state(self, topic: str, partition: int, pid: int) -> Response:
        tp = tp_key(topic, partition)
        address = self.addresses.get(tp)
        if address is not None:
            try:
                resp = self.leaders.producer_state(address, topic, partition, pid)
                if resp.error_code == errors.NONE:
                    return resp
            except PidleaseError:
                pass
            self.addresses.drop(tp)  # stale (leader moved or down): ask ZooKeeper again
        address = self._leader_addresses([tp])[tp]
        self.addresses.put(tp, address)
        resp = self.leaders.producer_state(address, topic, partition, pid)
        if resp.error_code != errors.NONE:
            # The topic exists in ZooKeeper, so NOT_LEADER or an unknown partition on the
            # server is a transition (leader moving, server still loading): retriable.
            raise CoordinatorUnavailable(
                f"leader of {tp} answered PRODUCER_STATE with "
                f"{errors.error_for_code(resp.error_code).name}: {resp.detail}"
            )
        return resp

    def _token(self, record: PidRecord) -> str:
        return make_token(
            self.settings.secret_bytes, record.pid, record.generation, record.expires_at_ms
        )

    # -- PID views and expiry --------------------------------------------------------------
    def pid_view(
        self, record: PidRecord, now_ms: int, live: dict[str, int | None] | None = None
    ) -> dict[str, Any]:
        parts = []
        for tp in sorted(record.partitions, key=split_tp_key):
            topic, p = split_tp_key(tp)
            entry: dict[str, Any] = {
                "topic": topic,
                "partition": p,
                "highwater": record.partitions[tp].get("highwater", -1),
                "seen": _seen(record, tp),
            }
            if live is not None:
                entry["live"] = live.get(tp) is not None
                if live.get(tp) is not None:
                    entry["highwater"] = live[tp]
            parts.append(entry)
        return {
            "producer_name": record.producer_name,
            "pid": record.pid,
            "owner": leases.owner_of(record),
            "generation": record.generation,
            "expire_ms": record.expire_ms,
            "expires_at_ms": record.expires_at_ms,
            "expires_in_ms": record.expires_at_ms - now_ms,
            "last_use_ms": record.last_use_ms,
            "created_ms": record.created_ms,
            "state": leases.lease_state(record, now_ms, self.limits.expiring_window_ms).value,
            "partitions": parts,
        }

    def list_pids(self, state: str | None, limit: int) -> list[dict[str, Any]]:
        now = self.clock_ms()
        out: list[dict[str, Any]] = []
        ids = self.store.list_pid_ids()
        for start in range(0, len(ids), 1000):
            for record, _ in self.store.get_pids(ids[start : start + 1000]):
                if not leases.retained(record, now, self.limits.retention_ms):
                    continue
                view = self.pid_view(record, now)
                if state is None or view["state"] == state:
                    out.append(view)
                    if len(out) >= limit:
                        return out
        return out

    def describe_pid(self, pid: int, principal: Principal = ANONYMOUS) -> dict[str, Any]:
        got = self.store.get_pid(pid)
        now = self.clock_ms()
        if got is None or not leases.retained(got[0], now, self.limits.retention_ms):
            raise UnknownPid(f"pid {pid} was never leased or its state has expired")
        record = got[0]
        self._check_owner(record, principal)
        live: dict[str, int | None] = {}
        try:
            lookup = self._leader_lookup(sorted(record.partitions))
        except PidleaseError:
            lookup = {}
        by_leader: dict[str, list[str]] = {}
        for tp, found in lookup.items():
            if isinstance(found, str):
                by_leader.setdefault(found, []).append(tp)
        answers = self._per_leader(
            by_leader,
            lambda address, chunk: self.leaders.producer_states(
                address, pid, [split_tp_key(tp) for tp in chunk]
            ),
            "PRODUCER_STATES",
        )
        for tp, answer in answers.items():
            # an unreachable leader leaves the recorded value
            ok = isinstance(answer, Response) and answer.error_code == errors.NONE
            live[tp] = (
                answer.durable_highwater
                if isinstance(answer, Response) and ok and answer.found
                else None
            )
        return self.pid_view(record, now, live)

    def sweep(self) -> int:
        """Delete PIDs past retention (and their name bindings); returns how many."""
        now = self.clock_ms()
        deleted = 0
        ids = self.store.list_pid_ids()
        for start in range(0, len(ids), 1000):
            for record, version in self.store.get_pids(ids[start : start + 1000]):
                expired = not leases.retained(record, now, self.limits.retention_ms)
                if expired and self.store.delete_pid(record, version):
                    self.records.drop(record.pid)
                    deleted += 1
        return deleted
