"""The pipeline's errors, under one root.

    PipelineError
    ├── OptionError        a data source option or CLI argument is missing or malformed
    ├── TopicModeError     the topic's dedup mode cannot give exactly-once for this write
    ├── StreamIdentityError  a stream's job_name was used by another query (checkpoint)
    ├── AttemptFenced      a newer attempt of the same Spark partition took the producer
    │                      name over; this attempt stopped cleanly and left the rest to it
    └── InjectedFailure    a fault the caller asked for (tests and demos), never raised
                           unless a fault option is set

SDK errors (``pidlease.errors``) pass through unchanged, except ``ProducerFenced`` raised
while a task writes, which becomes ``AttemptFenced`` with the attempt's figures attached.
"""

from __future__ import annotations

from typing import Any


class PipelineError(Exception):
    """Root of the pipeline's own errors."""


class OptionError(PipelineError, ValueError):
    pass


class TopicModeError(PipelineError):
    pass


class AttemptFenced(PipelineError):
    """This attempt was fenced by a newer one of the same producer name. ``figures`` holds
    what it did before (rows sent, appended, ...), for the job report."""

    def __init__(self, message: str, figures: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.figures = dict(figures or {})


class StreamIdentityError(OptionError):
    """A streaming write under a job name that another query (another checkpoint) used."""


class InjectedFailure(PipelineError):
    pass
