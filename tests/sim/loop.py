"""The simulation's event loop: asyncio's own scheduler with virtual time.

``time()`` is a number the loop advances itself: when nothing is ready, the "selector"
jumps straight to the next timer instead of blocking, so a run of seconds of virtual
time takes milliseconds. There are no file descriptors to watch (no sockets, no self
pipe): the simulated network feeds ``asyncio.StreamReader`` objects directly.

Blocking work that the server hands to an executor (fsyncs, ZooKeeper calls, snapshot
writes) runs on the loop thread at a later virtual time chosen by the seed, so a slow
fsync or a slow ZooKeeper read is just a later timer.

Every simulated process (a server incarnation) is a :class:`Node`; the context variable
:data:`NODE` says which one a task or callback belongs to. Tasks and callbacks inherit
it through asyncio's contexts, so killing a node (SIGKILL) is: mark it dead, and every
later callback of it is dropped. Its tasks never run again, nothing of it cleans up.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from typing import Any


class Node:
    """One simulated process. ``alive`` False: its callbacks are dropped."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.alive = True

    def __repr__(self) -> str:
        return f"Node({self.name}, {'alive' if self.alive else 'dead'})"


NODE: contextvars.ContextVar[Node | None] = contextvars.ContextVar("sim_node", default=None)


class Idle(Exception):
    """Nothing is ready and no timer is set: the simulation can make no progress."""


class _NoWaitSelector:
    def __init__(self, loop: SimLoop) -> None:
        self._loop = loop

    def select(self, timeout: float | None) -> list[Any]:
        if timeout is None:
            raise Idle("no ready callback and no timer")
        self._loop.advance(timeout)
        return []

    def close(self) -> None:
        pass


def _guarded(node: Node, callback: Callable[..., Any], *args: Any) -> None:
    if node.alive:
        callback(*args)


class SimLoop(asyncio.BaseEventLoop):
    """Virtual-time loop. ``executor_delay`` picks when executor work runs (seconds)."""

    def __init__(self, executor_delay: Callable[[Callable[..., Any]], float]) -> None:
        super().__init__()
        self._selector = _NoWaitSelector(self)
        self._now = 0.0
        self._clock_resolution = 1e-7
        self.executor_delay = executor_delay
        self.steps = 0
        self.max_steps = 5_000_000  # a bound on every run, whatever the seed does
        # Every task ever created, kept until the run ends: a killed node's tasks stay
        # pending forever and must not be collected (and closed, running their finally
        # blocks) in the middle of the run.
        self.tasks: list[asyncio.Task[Any]] = []

    def create_task(
        self,
        coro: Any,
        *,
        name: str | None = None,  # type: ignore[override]
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[Any]:
        t = super().create_task(coro, name=name, context=context)
        t._log_destroy_pending = False  # type: ignore[attr-defined]
        self.tasks.append(t)
        return t

    # -- time --------------------------------------------------------------------------
    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds
        if self._scheduled:
            # Land exactly on the next timer despite float rounding; and when asyncio is
            # about to run a timer early (within its clock resolution), move time to it,
            # or code waiting "until time T" would spin without time passing.
            when = self._scheduled[0].when()
            if when <= self._now + 2 * self._clock_resolution:
                self._now = max(self._now, when)

    # -- selector hooks (nothing to select) ----------------------------------------------
    def _process_events(self, event_list: list[Any]) -> None:
        self.steps += 1
        if self.steps > self.max_steps:
            raise Idle(f"runaway: over {self.max_steps} loop iterations")

    def _write_to_self(self) -> None:
        pass

    # -- node-aware scheduling ---------------------------------------------------------
    def call_soon(
        self,
        callback: Callable[..., Any],
        *args: Any,  # type: ignore[override]
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        node = context.get(NODE) if context is not None else NODE.get()
        if node is not None:
            return super().call_soon(_guarded, node, callback, *args, context=context)
        return super().call_soon(callback, *args, context=context)

    def call_at(
        self,
        when: float,
        callback: Callable[..., Any],
        *args: Any,  # type: ignore[override]
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        node = context.get(NODE) if context is not None else NODE.get()
        if node is not None:
            return super().call_at(when, _guarded, node, callback, *args, context=context)
        return super().call_at(when, callback, *args, context=context)

    def call_soon_threadsafe(
        self,
        callback: Callable[..., Any],
        *args: Any,  # type: ignore[override]
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        return self.call_soon(callback, *args, context=context)

    def run_in_executor(
        self,
        executor: Any,
        func: Callable[..., Any],  # type: ignore[override]
        *args: Any,
    ) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = self.create_future()

        def run() -> None:
            if fut.cancelled():
                return
            try:
                res = func(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting code
                fut.set_exception(exc)
            else:
                fut.set_result(res)

        self.call_later(self.executor_delay(func), run)
        return fut

    # -- no real I/O is possible here ----------------------------------------------------
    async def getaddrinfo(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        raise OSError("the simulation has no network")

    async def create_connection(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        raise OSError("the simulation has no network")

    async def create_server(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        raise OSError("the simulation has no network")
