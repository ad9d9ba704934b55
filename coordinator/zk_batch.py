"""Group commit for the coordinator's independent ZooKeeper writes.

Each new lease creates its PID's znode and each renewal compare-and-sets it: one ZooKeeper
request per lease, and under load most of the coordinator's and ZooKeeper's CPU goes to
the per-request work, not to the bytes. ``WriteBatcher`` sends the writes that arrive while
one request is in flight together, as one ZooKeeper ``multi`` transaction, the way a log
group-commits fsyncs: no added wait (a lone write goes out at once), and batches grow only
when writes queue up.

A ``multi`` is all-or-nothing, so one write that fails its check (a node that already
exists, a version that moved) would fail its neighbours too: when a batch comes back with
any failure, each of its writes is sent again on its own and gets its own answer. Writes
here never depend on each other (distinct PIDs), so the order inside a batch is free.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

log = logging.getLogger("coordinator.zk_batch")

EXPECTED = (NodeExistsError, BadVersionError, NoNodeError)


class WriteBatcher:
    """``submit(path, data, version)``: create ``path`` (version None) or set it if its
    version is still ``version``. The future resolves to True, or raises NodeExistsError,
    BadVersionError, NoNodeError, or whatever ``wait`` raises (CoordinatorUnavailable)."""

    def __init__(self, zk: Any, wait: Callable[[Any], Any], *, batch_max: int = 64) -> None:
        self._zk = zk
        self._wait = wait
        self.batch_max = batch_max
        self._q: queue.SimpleQueue[tuple[str, bytes, int | None, Future[bool]] | None] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.batches = 0  # multi requests sent
        self.batched_writes = 0  # writes that went in them
        self.fallbacks = 0  # batches re-sent one write at a time

    def submit(self, path: str, data: bytes, version: int | None) -> Future[bool]:
        fut: Future[bool] = Future()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="zk-batch", daemon=True)
                self._thread.start()
        self._q.put((path, data, version, fut))
        return fut

    def stop(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._q.put(None)
            thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            items = [item]
            stop = False
            while len(items) < self.batch_max:
                try:
                    nxt = self._q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                items.append(nxt)
            try:
                self._flush(items)
            except BaseException as exc:
                log.exception("write batch failed")
                for *_, fut in items:
                    if not fut.done():
                        fut.set_exception(exc)
            if stop:
                return

    def _flush(self, items: list[tuple[str, bytes, int | None, Future[bool]]]) -> None:
        if len(items) == 1:
            self._single(items[0])
            return
        tx = self._zk.transaction()
        for path, data, version, _ in items:
            if version is None:
                tx.create(path, data)
            else:
                tx.set_data(path, data, version)
        try:
            results = self._wait(tx.commit_async())
        except Exception as exc:  # noqa: BLE001 - ZooKeeper down: every write failed alike
            for *_, fut in items:
                fut.set_exception(exc)
            return
        self.batches += 1
        self.batched_writes += len(items)
        if not any(isinstance(r, Exception) for r in results):
            for *_, fut in items:
                fut.set_result(True)
            return
        self.fallbacks += 1
        for item in items:
            self._single(item)

    def _single(self, item: tuple[str, bytes, int | None, Future[bool]]) -> None:
        path, data, version, fut = item
        try:
            if version is None:
                self._wait(self._zk.create_async(path, data))
            else:
                self._wait(self._zk.set_async(path, data, version))
        except Exception as exc:  # noqa: BLE001 - handed to the caller
            fut.set_exception(exc)
            return
        fut.set_result(True)
