"""The SDK's retry policy: which errors are worth retrying, and how long to wait between
attempts (bounded exponential backoff, jittered, with the randomness injected).

Used by the partition senders (resends), the lease keeper (renewals) and the producer's
start (the first topic lookup and lease).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pidlease import errors

__all__ = ["Backoff", "retriable", "retrying"]

T = TypeVar("T")


def retriable(exc: BaseException) -> bool:
    """Worth another attempt: the error says so, or it is UNKNOWN_TOPIC_OR_PARTITION (a
    restarted server answers it until it has loaded the partition, and metadata may simply
    be stale)."""
    return isinstance(exc, errors.UnknownTopicOrPartition) or bool(getattr(exc, "retriable", False))


class Backoff:
    """Exponential backoff from ``base_ms`` up to ``cap_ms``, jittered by +-20%."""

    def __init__(self, *, base_ms: float, cap_ms: float, rng: random.Random) -> None:
        self.base_ms = base_ms
        self.cap_ms = cap_ms
        self.rng = rng
        self.failures = 0

    def next_ms(self) -> float:
        delay: float = min(self.cap_ms, self.base_ms * (2 ** min(self.failures, 30)))
        self.failures += 1
        return min(self.cap_ms, delay * (0.8 + 0.4 * self.rng.random()))

    def reset(self) -> None:
        self.failures = 0


async def retrying(
    call: Callable[[], Awaitable[T]],
    *,
    deadline_ms: float,
    backoff: Backoff,
    clock_ms: Callable[[], float],
) -> T:
    """``await call()`` until it succeeds, raises a fatal error, or ``deadline_ms`` passes."""
    while True:
        try:
            return await call()
        except errors.PidleaseError as exc:
            if not exc.retriable or clock_ms() + backoff.cap_ms > deadline_ms:
                raise
            await asyncio.sleep(backoff.next_ms() / 1000)
