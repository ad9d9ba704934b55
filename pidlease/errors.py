"""The error tree of pidlease, shared by the SDK, the coordinator and the partition servers.

Every error that crosses a wire has a name (the HTTP API's ``"error"`` field), a numeric
code (the binary protocol's 16-bit error field), an HTTP status and a ``retriable`` flag.
Each class registers itself where it is defined (``PidleaseError.__init_subclass__``), so
``ERRORS_BY_CODE`` and ``ERRORS_BY_NAME``, the one lookup both sides use, cannot miss a
class; a second class with the same code or name fails at import.

Client-side errors (marked ``wire = False``: no code of their own, never sent by a server)
have a name but no code; they are in ``CLIENT_ERRORS_BY_NAME``, not in the wire lookups.
``invalid_metadata`` marks the errors after which the producer looks the topic up again
(the leader moved, the partition or the server is gone).

    PidleaseError                 UNKNOWN_ERROR               1 fatal
    ├── ProducerFenced            FENCED                      3 fatal
    ├── UnknownPid                UNKNOWN_PID                 4 fatal
    ├── OutOfOrderSequence        OUT_OF_ORDER_SEQUENCE       5 fatal
    ├── Unauthorized              UNAUTHORIZED                6 fatal
    ├── InvalidRequest            INVALID_REQUEST             7 fatal (a server refused the request)
    ├── UnknownTopicOrPartition   UNKNOWN_TOPIC_OR_PARTITION  8 fatal, invalid_metadata
    ├── TopicExists               TOPIC_EXISTS                9 fatal
    ├── CorruptRecord             CORRUPT_RECORD             10 fatal (bad checksum or frame)
    ├── RecordTooLarge            RECORD_TOO_LARGE           11 fatal
    ├── Forbidden                 FORBIDDEN                  12 fatal (API token lacks the scope)
    ├── PidLimitExceeded          PID_LIMIT_EXCEEDED         13 fatal (PIDs per principal)
    ├── OffsetOutOfRange          OFFSET_OUT_OF_RANGE        14 fatal (below the log start)
    ├── SequenceUnknown           SEQUENCE_UNKNOWN           20 retriable
    ├── NotLeader                 NOT_LEADER                 21 retriable, invalid_metadata
    ├── CoordinatorUnavailable    COORDINATOR_UNAVAILABLE    22 retriable
    ├── ServerUnavailable         SERVER_UNAVAILABLE         23 retriable, invalid_metadata
    │                                                           (connection lost, disk full)
    ├── TooManyPids               TOO_MANY_PIDS              24 retriable (PIDs per partition)
    ├── NotEnoughReplicas         NOT_ENOUGH_REPLICAS        25 retriable (in-sync set below
    │                                                           min_insync_replicas)
    │   client-side (wire = False, no code):
    ├── ConfigError(ValueError)   CONFIG_ERROR                  a local mistake by the caller
    ├── DeliveryTimeout           DELIVERY_TIMEOUT              delivery_timeout_ms passed
    └── ProducerClosed            PRODUCER_CLOSED               closed, or failed earlier

``ConfigError`` is raised before anything is sent: a bad producer setting, URL or TLS
option, a partition number or sequence id the topic cannot take, a value of the wrong
type, a malformed input file. It is both a ``PidleaseError`` (one ``except`` for the SDK)
and a ``ValueError`` (what Python code expects for a bad argument). It is not an
``InvalidRequest``: that one means a server answered INVALID_REQUEST.

DUPLICATE is not an error: the server answers it with code 2 and the SDK turns it into a
successful ``RecordMetadata(duplicate=True)``.

To add a wire error: subclass ``PidleaseError`` with a new ``name``, ``code`` and
``http_status`` (and ``retriable``/``invalid_metadata`` when they apply), and add its row
to the tree above and to docs/sdk.md; the registry and tests/unit/test_errors.py do the rest.
"""

from __future__ import annotations

from typing import Any, ClassVar

# Wire codes that are not errors.
NONE = 0
DUPLICATE = 2

ERRORS_BY_CODE: dict[int, type[PidleaseError]] = {}
ERRORS_BY_NAME: dict[str, type[PidleaseError]] = {}
CLIENT_ERRORS_BY_NAME: dict[str, type[PidleaseError]] = {}
_RESERVED_CODES = frozenset({NONE, DUPLICATE})


def _register(cls: type[PidleaseError]) -> None:
    """Enter ``cls`` in the lookups; a duplicate code or name is a programming error,
    raised at import so it cannot ship."""
    name = cls.__dict__.get("name")
    if name is None:
        if "code" in cls.__dict__:
            raise TypeError(f"{cls.__qualname__} has a code but no name of its own")
        return  # a subclass that keeps its parent's identity (e.g. a test's): not registered
    if name in ERRORS_BY_NAME or name in CLIENT_ERRORS_BY_NAME:
        other = ERRORS_BY_NAME.get(name) or CLIENT_ERRORS_BY_NAME[name]
        raise TypeError(
            f"error name {name!r} of {cls.__qualname__} is taken by {other.__qualname__}"
        )
    if not cls.wire:
        if "code" in cls.__dict__:
            raise TypeError(f"{cls.__qualname__} is client-side (wire = False) but has a code")
        CLIENT_ERRORS_BY_NAME[name] = cls
        return
    if "code" not in cls.__dict__:
        raise TypeError(f"wire error {cls.__qualname__} needs a code of its own (or wire = False)")
    code = cls.code
    if code in _RESERVED_CODES or not 0 < code < 2**15:
        raise TypeError(f"error code {code} of {cls.__qualname__} is reserved or out of range")
    if code in ERRORS_BY_CODE:
        raise TypeError(
            f"error code {code} of {cls.__qualname__} is taken by "
            f"{ERRORS_BY_CODE[code].__qualname__}"
        )
    ERRORS_BY_CODE[code] = cls
    ERRORS_BY_NAME[name] = cls


class PidleaseError(Exception):
    """Root of every pidlease error. ``retriable`` says whether a retry may succeed;
    ``invalid_metadata`` whether the topic's leaders should be looked up again first."""

    name: ClassVar[str] = "UNKNOWN_ERROR"
    code: ClassVar[int] = 1
    http_status: ClassVar[int] = 500
    retriable: ClassVar[bool] = False
    invalid_metadata: ClassVar[bool] = False
    wire: ClassVar[bool] = True  # False: raised by the SDK only, never sent (no code)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A class that does not say otherwise inherits its parent's wire-ness, so a
        # client-side error's subclass stays client-side.
        _register(cls)

    def __init__(self, detail: str = "", **extra: object) -> None:
        super().__init__(detail or self.name)
        self.detail = detail or self.name
        self.extra = extra

    def to_json(self) -> dict[str, object]:
        return {"error": self.name, "detail": self.detail, **self.extra}


_register(PidleaseError)


class _DescribesBatch:
    """What a failed record's error says of its batch (in ``extra``, read through these
    properties): ``partition``, ``first_sequence`` and ``last_sequence`` (None when the
    batch was never numbered: the producer numbers its records when a batch leaves for the
    server) and ``indeterminate``. False: the batch was not written (it never left the
    producer, or every attempt of it was refused before any append); True: it may have
    been written (an attempt got no answer, or one that could come after an append). A
    batch is written whole or not at all."""

    extra: dict[str, object]

    @property
    def indeterminate(self) -> bool:
        # Not said (an error that is not about one batch, or a path that did not classify):
        # assume the worst, that something may have been written.
        v = self.extra.get("indeterminate")
        return v if isinstance(v, bool) else True

    @property
    def partition(self) -> int | None:
        return _int_or_none(self.extra.get("partition"))

    @property
    def first_sequence(self) -> int | None:
        return _int_or_none(self.extra.get("first_sequence"))

    @property
    def last_sequence(self) -> int | None:
        return _int_or_none(self.extra.get("last_sequence"))


class ProducerFenced(_DescribesBatch, PidleaseError):
    """A newer holder of the producer name (a takeover) has the PID: this producer may
    write nothing more.

    When it fails a sent record's future, it describes that record's batch (in ``extra``,
    read through the properties): ``partition``, ``first_sequence`` and ``last_sequence``
    (None when the batch was never numbered: the producer numbers its records when a
    batch leaves for the server) and ``indeterminate``. False: the batch was not written
    (it never left the producer, or every attempt of it was refused before any append);
    True: it may have been written (an attempt got no answer, or one that could come
    after an append). A batch is written whole or not at all. To learn which, take the
    name over and compare ``last_sequence_id(partition)`` with ``last_sequence``, or read
    the partition (docs/sdk.md, "When a producer is fenced")."""

    name, code, http_status = "FENCED", 3, 409


def _int_or_none(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


class UnknownPid(PidleaseError):
    name, code, http_status = "UNKNOWN_PID", 4, 404


class OutOfOrderSequence(PidleaseError):
    """Carries ``expected_sequence`` in ``extra`` when the server sent it."""

    name, code, http_status = "OUT_OF_ORDER_SEQUENCE", 5, 409


class Unauthorized(PidleaseError):
    name, code, http_status = "UNAUTHORIZED", 6, 401


class InvalidRequest(PidleaseError):
    """A server refused the request as malformed or not allowed. Mistakes the SDK can see
    before sending raise ``ConfigError`` instead."""

    name, code, http_status = "INVALID_REQUEST", 7, 400


class UnknownTopicOrPartition(PidleaseError):
    name, code, http_status = "UNKNOWN_TOPIC_OR_PARTITION", 8, 404
    invalid_metadata = True


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


class OffsetOutOfRange(PidleaseError):
    """A read below the partition's log start (retention deleted those records). Carries
    ``earliest`` (the log start) and ``latest`` (the high watermark) in ``extra``; fatal to
    that reader: start again from ``earliest`` on purpose, records were skipped."""

    name, code, http_status = "OFFSET_OUT_OF_RANGE", 14, 416

    @property
    def earliest(self) -> int:
        v = self.extra.get("earliest")
        return v if isinstance(v, int) else -1

    @property
    def latest(self) -> int:
        v = self.extra.get("latest")
        return v if isinstance(v, int) else -1


class SequenceUnknown(PidleaseError):
    name, code, http_status, retriable = "SEQUENCE_UNKNOWN", 20, 409, True


class NotLeader(PidleaseError):
    """Carries ``leader`` ("host:port") in ``extra`` when the server knows it."""

    name, code, http_status, retriable = "NOT_LEADER", 21, 421, True
    invalid_metadata = True


class CoordinatorUnavailable(PidleaseError):
    name, code, http_status, retriable = "COORDINATOR_UNAVAILABLE", 22, 503, True


class ServerUnavailable(PidleaseError):
    name, code, http_status, retriable = "SERVER_UNAVAILABLE", 23, 503, True
    invalid_metadata = True


class TooManyPids(PidleaseError):
    """A partition already tracks its limit of PIDs and none is idle enough to evict; a new
    PID is refused rather than forgetting the state of a live one (KIP-936)."""

    name, code, http_status, retriable = "TOO_MANY_PIDS", 24, 429, True


class NotEnoughReplicas(PidleaseError):
    """The partition's in-sync set is smaller than its topic's ``min_insync_replicas``: the
    leader refuses a write with nothing written, or fails an appended batch's wait for its
    ack when the set shrank below the minimum after the append (the batch stays in the log,
    uncommitted: its resend is answered SEQUENCE_UNKNOWN until the set grows back and
    commits it, then DUPLICATE). Retriable: the producer resends until a follower is back
    in sync, or its delivery timeout."""

    name, code, http_status, retriable = "NOT_ENOUGH_REPLICAS", 25, 503, True


# -- client-side errors: raised by the SDK, never sent by a server -------------------------


class CommitFailed(PidleaseError):
    """A consumer group rebalanced since the records were read: their offsets are not
    committed (another member may read them again); the ``Consumer``'s next poll rejoins.
    SDK-only (``pidlease.client.consumer``), defined here so the registry holds it whether
    or not the consumer was imported."""

    name, wire, retriable = "COMMIT_FAILED", False, True


class ConfigError(PidleaseError, ValueError):
    """A local mistake by the caller, found before anything is sent: a bad setting, URL or
    TLS option, a partition or sequence id the topic cannot take, a value of the wrong
    type, a malformed input file. A ``ValueError`` too, as Python code expects."""

    name, wire = "CONFIG_ERROR", False


class DeliveryTimeout(_DescribesBatch, PidleaseError):
    """``delivery_timeout_ms`` passed before a record was acknowledged. The outcome of its
    batch is unknown, so the producer cannot continue its sequence: it is closed. A new
    producer with the same ``producer_name`` resumes from the durable sequence.

    On a record's future it describes that record's batch as ``ProducerFenced`` does
    (``partition``, ``first_sequence``, ``last_sequence``, ``indeterminate``), so an
    application numbering its own records learns what to resend (docs/sdk.md, "When a
    producer is fenced (or times out)")."""

    name, wire = "DELIVERY_TIMEOUT", False


class ProducerClosed(PidleaseError):
    """The producer was closed, or failed earlier (the cause is chained)."""

    name, wire = "PRODUCER_CLOSED", False


def error_for_code(code: int, detail: str = "", **extra: object) -> PidleaseError:
    """The exception for a wire error code; unknown codes map to the root class."""
    return ERRORS_BY_CODE.get(code, PidleaseError)(detail, **extra)


def error_for_name(name: str, detail: str = "", **extra: object) -> PidleaseError:
    """The exception for an HTTP ``"error"`` name; unknown names map to the root class."""
    return ERRORS_BY_NAME.get(name, PidleaseError)(detail, **extra)


def describe(exc: BaseException) -> str:
    """An exception as a log line should show it: its type and its text, or its repr when
    the text is empty. Many exceptions carry none (kazoo's ``ConnectionLoss()``, a bare
    ``TimeoutError()``), and ``"%s" % exc`` would log ``set_isr failed: `` with nothing
    after it."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else repr(exc)
