"""Progress lines while a Spark job runs, from the driver's status tracker.

A daemon thread polls ``SparkContext.statusTracker()`` every ``interval_s`` and prints
one line per change: the running stages with tasks done / total, and how long the job has
taken. Spark's own console bar is off (``pidlease.spark.session``) because it redraws in place,
which logs and CI output mangle.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Self, TextIO


class Progress:
    def __init__(
        self, spark: Any, what: str, *, interval_s: float = 2.0, out: TextIO | None = None
    ) -> None:
        self._tracker = spark.sparkContext.statusTracker()
        self.what = what
        self.interval_s = interval_s
        self.out = out or sys.stderr
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self._last = ""
        self.lines = 0

    def line(self) -> str:
        """One status line: every active stage's completed/total tasks."""
        parts = []
        for sid in sorted(self._tracker.getActiveStageIds()):
            info = self._tracker.getStageInfo(sid)
            if info is None:
                continue
            parts.append(
                f"stage {sid}: {info.numCompletedTasks}/{info.numTasks} tasks done"
                + (f", {info.numActiveTasks} running" if info.numActiveTasks else "")
                + (f", {info.numFailedTasks} failed" if info.numFailedTasks else "")
            )
        return "; ".join(parts) or "no stage running (planning or committing)"

    def say(self, text: str) -> None:
        print(
            f"[{self.what} {time.monotonic() - self._started:6.1f}s] {text}",
            file=self.out,
            flush=True,
        )
        self.lines += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                now = self.line()
            except Exception as exc:  # noqa: BLE001 - progress must never kill the job
                now = f"(no status: {exc})"
            if now != self._last:
                self.say(now)
                self._last = now

    def __enter__(self) -> Self:
        self._started = time.monotonic()
        self.say("started")
        self._thread = threading.Thread(target=self._run, name="pidlease-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval_s + 5)
        self.say("failed" if exc and exc[0] is not None else "done")


def task_attempts(spark: Any, job_group: str, max_tasks: int = 100_000) -> list[dict[str, Any]]:
    """Every task attempt of the last stage of the last job run in ``job_group`` (the
    write's stage, when the group is set around a ``save()``), from the driver's status
    store: what only the driver knows, e.g. which attempts were speculative copies.
    Empty when Spark cannot say (a status store that has dropped the job)."""
    sc = spark.sparkContext
    tracker = sc.statusTracker()
    jobs = sorted(tracker.getJobIdsForGroup(job_group))
    job = tracker.getJobInfo(jobs[-1]) if jobs else None
    if job is None or not list(job.stageIds):
        return []
    stage_id = max(job.stageIds)
    stage = tracker.getStageInfo(stage_id)
    stage_attempts = (stage.currentAttemptId if stage is not None else 0) + 1
    # The status store is not in PySpark's API; py4j reaches the driver's (AppStatusStore).
    store = sc._jsc.sc().statusStore()  # noqa: SLF001 - no public way to the status store
    out: list[dict[str, Any]] = []
    for stage_attempt in range(stage_attempts):
        tasks = store.taskList(stage_id, stage_attempt, max_tasks)
        for i in range(tasks.size()):
            t = tasks.apply(i)
            out.append(
                {
                    "index": int(t.index()),
                    "attempt": int(t.attempt()),
                    "speculative": bool(t.speculative()),
                    "status": str(t.status()),
                    "executor": str(t.executorId()),
                    "host": str(t.host()),
                }
            )
    return out
