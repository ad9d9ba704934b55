"""The producer's PID lease: leased at start, renewed in the background, and the token
every produce request carries.

At start, partition 0 is leased with ``pid=-1`` (and the producer name, which makes a
known name a takeover), then every other partition in one batch request with that pid
and generation; each answer's ``sequence_number`` is where that partition continues.
Partitions added to the topic later are leased by ``extend`` (the producer looks at the
topic after each renewal). Renewal asks for all partitions again at half the lease's
lifetime, measured from when the request left, so our idea of the expiry is never later
than the coordinator's. A token is used only until a margin before it expires (10 %, at
most 5 s), so a batch never arrives with a dying token; when renewals keep failing the
token runs out and the partitions wait (``token_ok`` is False) until a renewal succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from typing import Any

from pidlease import errors
from pidlease.client.lease_client import AsyncLeaseClient, Lease
from pidlease.client.retry import Backoff, retrying

__all__ = ["LeaseKeeper", "retrying"]

log = logging.getLogger("pidlease.client.producer")


class LeaseKeeper:
    def __init__(
        self,
        client: AsyncLeaseClient,
        topic: str,
        *,
        producer_name: str | None,
        expire_ms: int | None,
        clock_ms: Callable[[], float],
        rng: random.Random,
        backoff_ms: float,
        backoff_max_ms: float,
        on_fatal: Callable[[errors.PidleaseError], None],
        on_renewed: Callable[[], None],
        on_renewal: Callable[[], None] = lambda: None,
    ) -> None:
        self.client = client
        self.topic = topic
        self.producer_name = producer_name
        self.expire_ms = expire_ms
        self.clock_ms = clock_ms
        self.pid = -1
        self.generation = -1
        self.token = ""
        self.renewals = 0
        self._rng = rng
        self._backoff_ms = (backoff_ms, backoff_max_ms)
        self._on_fatal = on_fatal
        self._on_renewed = on_renewed
        self._on_renewal = on_renewal
        self._good_until = 0.0
        self._renew_at = 0.0
        self._partitions = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    def backoff(self) -> Backoff:
        return Backoff(base_ms=self._backoff_ms[0], cap_ms=self._backoff_ms[1], rng=self._rng)

    def token_ok(self, now_ms: float) -> bool:
        return now_ms < self._good_until

    def request(self, partition: int) -> dict[str, Any]:
        req: dict[str, Any] = {
            "topic": self.topic,
            "partition": partition,
            "pid": self.pid,
            "generation": self.generation,
        }
        if self.expire_ms is not None:
            req["expire_ms"] = self.expire_ms
        return req

    def _take(self, lease: Lease, sent_at_ms: float) -> None:
        margin = min(lease.expire_ms * 0.1, 5_000)
        good_until = sent_at_ms + lease.expire_ms - margin
        if good_until >= self._good_until:
            self.token = lease.lease_token
            self._good_until = good_until
            self._renew_at = sent_at_ms + lease.expire_ms / 2

    async def acquire(self, partitions: int, deadline_ms: float) -> dict[int, Lease]:
        """Lease every partition; retriable failures are retried until ``deadline_ms``."""
        self._partitions = partitions
        sent_at = self.clock_ms()
        first = await retrying(
            lambda: self.client.lease(
                self.topic,
                0,
                -1,
                producer_name=self.producer_name,
                expire_ms=self.expire_ms,
                partitions=partitions,  # a takeover fences them all: a longer timeout
            ),
            deadline_ms=deadline_ms,
            backoff=self.backoff(),
            clock_ms=self.clock_ms,
        )
        self.pid, self.generation = first.pid, first.generation
        self._take(first, sent_at)
        leases = {0: first}
        backoff = self.backoff()
        while len(leases) < partitions:
            todo = [p for p in range(partitions) if p not in leases]
            sent_at = self.clock_ms()
            try:
                answers = await self.client.lease_batch([self.request(p) for p in todo])
            except errors.PidleaseError as exc:
                answers = [exc] * len(todo)
            last: errors.PidleaseError | None = None
            for p, ans in zip(todo, answers, strict=True):
                if isinstance(ans, Lease):
                    leases[p] = ans
                    self._take(ans, sent_at)
                elif not ans.retriable:
                    raise ans
                else:
                    last = ans
            if last is not None:
                if self.clock_ms() + backoff.cap_ms > deadline_ms:
                    raise last
                await asyncio.sleep(backoff.next_ms() / 1000)
        return leases

    @property
    def partitions(self) -> int:
        return self._partitions

    async def extend(self, partitions: int) -> dict[int, Lease]:
        """Lease the partitions from the current count up to ``partitions`` (added to the
        topic since) with this PID and generation, in one batch; renewals cover them from
        then on. Raises the first failure (nothing is added then: the caller tries again
        at the next renewal)."""
        new = list(range(self._partitions, partitions))
        if not new:
            return {}
        sent_at = self.clock_ms()
        answers = await self.client.lease_batch([self.request(p) for p in new])
        leases: dict[int, Lease] = {}
        for p, ans in zip(new, answers, strict=True):
            if not isinstance(ans, Lease):
                raise ans
            leases[p] = ans
        for lease in leases.values():
            self._take(lease, sent_at)
        self._partitions = partitions
        return leases

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="lease-renewal")

    def halt(self) -> None:
        """Stop renewing (the producer failed); ``stop()`` still reaps the task."""
        self._stopped = True
        self._wake.set()

    async def stop(self) -> None:
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        try:
            await self._renew_forever()
        except Exception as exc:  # a bug here must fail the producer, not starve it
            # Without renewals the token lapses and every sender waits for a renewal that
            # never comes (token_ok stays False): flush() and close() would wait for ever
            # with the event loop idle and no request sent.
            log.exception("lease renewal of topic %s crashed", self.topic)
            self._on_fatal(errors.PidleaseError(f"lease renewal crashed: {exc!r}"))

    async def _renew_forever(self) -> None:
        backoff = self.backoff()
        while not self._stopped:
            delay_s = max(0.0, (self._renew_at - self.clock_ms()) / 1000)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):  # woken early or the renewal is due
                await asyncio.wait_for(self._wake.wait(), delay_s)
            if self._stopped:
                return
            if self.clock_ms() < self._renew_at:
                continue
            sent_at = self.clock_ms()
            try:
                answers = await self.client.lease_batch(
                    [self.request(p) for p in range(self._partitions)]
                )
                for a in answers:
                    if isinstance(a, errors.PidleaseError) and not a.retriable:
                        raise a
                good = [a for a in answers if isinstance(a, Lease)]
                if not good:
                    raise next(a for a in answers if isinstance(a, errors.PidleaseError))
            except errors.PidleaseError as exc:
                if not exc.retriable:
                    self._on_fatal(exc)
                    return
                log.info("lease renewal failed (%s: %s); retrying", exc.name, exc.detail)
                self._renew_at = self.clock_ms() + backoff.next_ms()
                continue
            backoff.reset()
            self.renewals += 1
            was_ok = self.token_ok(self.clock_ms())
            for a in good:
                self._take(a, sent_at)
            if not was_ok:
                self._on_renewed()
            self._on_renewal()
