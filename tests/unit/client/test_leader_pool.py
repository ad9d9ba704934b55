"""A sender waiting on another task's leader lookup or connect (``LeaderPool`` shares one
of each at a time) must get a retriable error when that task ends with anything but a
PidleaseError: the shared future used to be cancelled, so the waiting sender got
CancelledError, which ``PartitionSender._run`` does not catch (it is no Exception): its
task ended silently, its records never resolved and flush() waited for ever (one of the
ways to the open finding of docs/operations.md)."""

from __future__ import annotations

import asyncio

from pidlease import errors
from pidlease.client.leader_pool import LeaderPool

# tests/unit/conftest.py: each test of this module runs on the fast and the readable path
SDK_BOTH_PATHS = True


class _StuckClient:
    """A coordinator client whose lookup waits for ``go`` and then fails unexpectedly."""

    def __init__(self) -> None:
        self.go = asyncio.Event()

    async def topic(self, name: str, *, offsets: bool = True) -> object:
        await self.go.wait()
        raise RuntimeError("unexpected error in the HTTP stack")


def test_a_lookup_that_ends_unexpectedly_gives_its_waiters_a_retriable_error() -> None:
    async def main() -> tuple[BaseException | None, BaseException | None]:
        client = _StuckClient()
        pool = LeaderPool(
            client,  # type: ignore[arg-type]
            "t",
            connect_timeout_ms=1000,
            refresh_min_ms=0,
            clock_ms=lambda: 0.0,
        )
        owner = asyncio.get_running_loop().create_task(pool.refresh())
        await asyncio.sleep(0)  # the owner's lookup is under way

        async def waiter() -> BaseException | None:
            try:
                await pool.refresh()  # shares the owner's lookup
            except BaseException as exc:  # noqa: BLE001 - what it gets is the point
                return exc
            return None

        w = asyncio.get_running_loop().create_task(waiter())
        await asyncio.sleep(0)
        client.go.set()
        got = await w
        owner_exc = (await asyncio.gather(owner, return_exceptions=True))[0]
        return got, owner_exc

    got, owner_exc = asyncio.run(main())
    assert isinstance(owner_exc, RuntimeError), owner_exc  # the owner sees its own error
    assert isinstance(got, errors.PidleaseError) and got.retriable, (
        f"the waiting sender got {got!r}, not a retriable PidleaseError"
    )
