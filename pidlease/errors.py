"""The error tree of pidlease, shared by the SDK, the coordinator and the partition servers.

Every error that crosses a wire has a name (the HTTP API's ``"error"`` field), a numeric
code (the binary protocol's 16-bit error field), an HTTP status and a ``retriable`` flag.
``ERRORS_BY_CODE`` and ``ERRORS_BY_NAME`` are the one lookup both sides use.

    PidleaseError
    ├── ProducerFenced          FENCED                    fatal
    ├── UnknownPid              UNKNOWN_PID               fatal
    ├── OutOfOrderSequence      OUT_OF_ORDER_SEQUENCE     fatal
    ├── Unauthorized            UNAUTHORIZED              fatal
    ├── InvalidRequest          INVALID_REQUEST           fatal
    ├── UnknownTopicOrPartition UNKNOWN_TOPIC_OR_PARTITION fatal
    ├── TopicExists             TOPIC_EXISTS              fatal
    ├── CorruptRecord           CORRUPT_RECORD            fatal (bad checksum or frame)
    ├── RecordTooLarge          RECORD_TOO_LARGE          fatal
    ├── Forbidden               FORBIDDEN                 fatal (API token lacks the scope)
    ├── PidLimitExceeded        PID_LIMIT_EXCEEDED        fatal (PIDs per principal)
    ├── TooManyPids             TOO_MANY_PIDS             retriable (tracked PIDs per partition)
    ├── SequenceUnknown         SEQUENCE_UNKNOWN          retriable
    ├── NotLeader               NOT_LEADER                retriable
    ├── CoordinatorUnavailable  COORDINATOR_UNAVAILABLE   retriable
    └── ServerUnavailable       SERVER_UNAVAILABLE        retriable (connection lost, disk full)

DUPLICATE is not an error: the server answers it with code 2 and the SDK turns it into a
successful ``RecordMetadata(duplicate=True)``.
"""

from __future__ import annotations

from typing import ClassVar

# Wire codes that are not errors.
NONE = 0
DUPLICATE = 2


class PidleaseError(Exception):
    """Root of every pidlease error. ``retriable`` says whether a retry may succeed."""

    name: ClassVar[str] = "UNKNOWN_ERROR"
    code: ClassVar[int] = 1
    http_status: ClassVar[int] = 500
    retriable: ClassVar[bool] = False

    def __init__(self, detail: str = "", **extra: object) -> None:
        super().__init__(detail or self.name)
        self.detail = detail or self.name
        self.extra = extra

    def to_json(self) -> dict[str, object]:
        return {"error": self.name, "detail": self.detail, **self.extra}


class ProducerFenced(PidleaseError):
    name, code, http_status = "FENCED", 3, 409


class UnknownPid(PidleaseError):
    name, code, http_status = "UNKNOWN_PID", 4, 404


class OutOfOrderSequence(PidleaseError):
    """Carries ``expected_sequence`` in ``extra`` when the server sent it."""

    name, code, http_status = "OUT_OF_ORDER_SEQUENCE", 5, 409


class Unauthorized(PidleaseError):
    name, code, http_status = "UNAUTHORIZED", 6, 401


class InvalidRequest(PidleaseError):
    name, code, http_status = "INVALID_REQUEST", 7, 400


class UnknownTopicOrPartition(PidleaseError):
    name, code, http_status = "UNKNOWN_TOPIC_OR_PARTITION", 8, 404


class TopicExists(PidleaseError):
    name, code, http_status = "TOPIC_EXISTS", 9, 409


class CorruptRecord(PidleaseError):
    name, code, http_status = "CORRUPT_RECORD", 10, 400


class RecordTooLarge(PidleaseError):
    name, code, http_status = "RECORD_TOO_LARGE", 11, 413


class Forbidden(PidleaseError):
    """The API token is valid but its scope does not allow this call (e.g. a producer token
    creating a topic)."""

    name, code, http_status = "FORBIDDEN", 12, 403


class PidLimitExceeded(PidleaseError):
    """A principal already holds its limit of PIDs; reuse producer names (takeover) instead of
    leasing new PIDs, or wait for old ones to pass retention."""

    name, code, http_status = "PID_LIMIT_EXCEEDED", 13, 429


class TooManyPids(PidleaseError):
    """A partition already tracks its limit of PIDs and none is idle enough to evict; a new
    PID is refused rather than forgetting the state of a live one (KIP-936)."""

    name, code, http_status, retriable = "TOO_MANY_PIDS", 24, 429, True


class SequenceUnknown(PidleaseError):
    name, code, http_status, retriable = "SEQUENCE_UNKNOWN", 20, 409, True


class NotLeader(PidleaseError):
    """Carries ``leader`` ("host:port") in ``extra`` when the server knows it."""

    name, code, http_status, retriable = "NOT_LEADER", 21, 421, True


class CoordinatorUnavailable(PidleaseError):
    name, code, http_status, retriable = "COORDINATOR_UNAVAILABLE", 22, 503, True


class ServerUnavailable(PidleaseError):
    name, code, http_status, retriable = "SERVER_UNAVAILABLE", 23, 503, True


_ALL: tuple[type[PidleaseError], ...] = (
    PidleaseError,
    ProducerFenced,
    UnknownPid,
    OutOfOrderSequence,
    Unauthorized,
    InvalidRequest,
    UnknownTopicOrPartition,
    TopicExists,
    CorruptRecord,
    RecordTooLarge,
    Forbidden,
    PidLimitExceeded,
    TooManyPids,
    SequenceUnknown,
    NotLeader,
    CoordinatorUnavailable,
    ServerUnavailable,
)
ERRORS_BY_CODE: dict[int, type[PidleaseError]] = {cls.code: cls for cls in _ALL}
ERRORS_BY_NAME: dict[str, type[PidleaseError]] = {cls.name: cls for cls in _ALL}


def error_for_code(code: int, detail: str = "", **extra: object) -> PidleaseError:
    """The exception for a wire error code; unknown codes map to the root class."""
    return ERRORS_BY_CODE.get(code, PidleaseError)(detail, **extra)


def error_for_name(name: str, detail: str = "", **extra: object) -> PidleaseError:
    """The exception for an HTTP ``"error"`` name; unknown names map to the root class."""
    return ERRORS_BY_NAME.get(name, PidleaseError)(detail, **extra)
