"""The error tree: codes and names unique, the lookups complete, registration loud."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from kazoo.exceptions import ConnectionLoss

from pidlease import errors
from pidlease.client import producer, sender
from pidlease.errors import NotEnoughReplicas, NotLeader, describe


def _tree() -> list[type[errors.PidleaseError]]:
    out, todo = [], [errors.PidleaseError]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return out


def test_every_error_class_is_registered_under_a_unique_code_and_name() -> None:
    tree = [c for c in _tree() if c.__module__ == errors.__name__]
    wire = [c for c in tree if c.wire]
    client = [c for c in tree if not c.wire]
    assert len({c.code for c in wire}) == len(wire)
    assert len({c.name for c in tree}) == len(tree)
    assert set(errors.ERRORS_BY_CODE.values()) == set(wire)
    assert set(errors.ERRORS_BY_NAME.values()) == set(wire)
    assert set(errors.CLIENT_ERRORS_BY_NAME.values()) == set(client)
    assert {errors.ConfigError, errors.DeliveryTimeout, errors.ProducerClosed} <= set(client)
    for cls in wire:
        assert errors.ERRORS_BY_CODE[cls.code] is cls and errors.ERRORS_BY_NAME[cls.name] is cls
        assert cls.code not in (errors.NONE, errors.DUPLICATE)
        assert 0 < cls.code <= 0xFFFF and 100 <= cls.http_status < 600


def test_wire_lookups_give_the_class_of_each_code_and_name() -> None:
    for code, cls in errors.ERRORS_BY_CODE.items():
        exc = errors.error_for_code(code, "why", leader="h:1")
        assert type(exc) is cls and exc.detail == "why" and exc.extra == {"leader": "h:1"}
        assert type(errors.error_for_name(cls.name, "why")) is cls
        assert exc.to_json()["error"] == cls.name
    # A code or name from a newer server is still an error, of the root class.
    assert type(errors.error_for_code(999)) is errors.PidleaseError
    assert type(errors.error_for_name("FROM_THE_FUTURE")) is errors.PidleaseError
    # Client-side names never come from a server: not in the wire lookup.
    assert type(errors.error_for_name("PRODUCER_CLOSED")) is errors.PidleaseError


def test_a_duplicate_code_or_name_fails_at_definition() -> None:
    with pytest.raises(TypeError, match=r"code 21 .* taken by NotLeader"):
        type("Again", (errors.PidleaseError,), {"name": "AGAIN", "code": 21})
    with pytest.raises(TypeError, match=r"name 'FENCED' .* taken by ProducerFenced"):
        type("Fenced2", (errors.PidleaseError,), {"name": "FENCED", "code": 99})
    with pytest.raises(TypeError, match="name 'PRODUCER_CLOSED'"):
        type("Closed2", (errors.PidleaseError,), {"name": "PRODUCER_CLOSED", "wire": False})
    with pytest.raises(TypeError, match="needs a code"):
        type("NoCode", (errors.PidleaseError,), {"name": "NO_CODE"})
    with pytest.raises(TypeError, match="reserved"):
        type("Dup", (errors.PidleaseError,), {"name": "DUP", "code": errors.DUPLICATE})
    with pytest.raises(TypeError, match="client-side"):
        type("Both", (errors.PidleaseError,), {"name": "BOTH", "code": 98, "wire": False})
    assert 98 not in errors.ERRORS_BY_CODE and "AGAIN" not in errors.ERRORS_BY_NAME


def test_a_subclass_without_a_name_of_its_own_keeps_its_parents_identity() -> None:
    class Mine(errors.NotLeader):
        pass

    assert (
        Mine.code == errors.NotLeader.code and errors.ERRORS_BY_CODE[Mine.code] is errors.NotLeader
    )
    assert Mine.invalid_metadata and Mine.retriable


def test_invalid_metadata_marks_the_errors_after_which_leaders_are_looked_up_again() -> None:
    stale = {c for c in errors.ERRORS_BY_CODE.values() if c.invalid_metadata}
    assert stale == {errors.NotLeader, errors.UnknownTopicOrPartition, errors.ServerUnavailable}


def test_client_side_errors_keep_their_old_import_paths() -> None:
    assert sender.DeliveryTimeout is producer.DeliveryTimeout is errors.DeliveryTimeout
    assert sender.ProducerClosed is producer.ProducerClosed is errors.ProducerClosed


def test_config_error_is_a_value_error_and_not_a_server_answer() -> None:
    exc = errors.ConfigError("linger_ms=-1 must be 0..60000")
    assert isinstance(exc, ValueError) and isinstance(exc, errors.PidleaseError)
    assert not isinstance(exc, errors.InvalidRequest) and not exc.retriable


# The SDK's modules (the tooling, devcluster/zkserver/faultproxy/devctl/demo/cli, raises
# its own errors for its own users).
SDK_MODULES = (
    "client.accumulator",
    "client.connection",
    "client.leader_pool",
    "client.lease_client",
    "client.lease_keeper",
    "client.partitioner",
    "client.producer",
    "wire.protocol",
    "client.reader",
    "client.record_future",
    "client.producer_batch",
    "client.sender",
    "client.config",
    "client.retry",
    "client.structs",
    "wire.tls",
    "wire.token",
    "cli.verify",
)
# Raised by the SDK and not in the tree, each for a reason: the concurrent.futures.Future
# contract (RecordFuture.result), attribute lookup, and programming errors inside the SDK.
NOT_IN_TREE = {
    ("client.record_future", "TimeoutError"),
    ("client.record_future", "CancelledError"),
    ("client.record_future", "AttributeError"),
    ("client.partitioner", "ValueError"),  # Partitioner(0): the producer never builds one
    # a lifecycle move that is not a transition (ProducerState, SenderState): a bug in the SDK
    ("client.producer", "RuntimeError"),
    ("client.sender", "RuntimeError"),
    ("wire.protocol", "ValueError"),  # encoding a string over 65535 bytes: a caller's bug
    ("wire.tls", "ValueError"),  # server_ssl_context / peer_ssl_context: the servers' side
}


def _raised_names(module: str) -> set[str]:
    tree = ast.parse(
        Path(errors.__file__).parent.joinpath(*module.split(".")).with_suffix(".py").read_text()
    )
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            name = exc.attr if isinstance(exc, ast.Attribute) else getattr(exc, "id", "")
            if name[:1].isupper():  # a class; not a variable or a helper that builds a tree error
                out.add(name)
    return out


def test_every_error_the_sdk_raises_is_in_the_tree() -> None:
    tree = {c.__name__ for c in _tree()}
    outside = {(m, name) for m in SDK_MODULES for name in _raised_names(m) if name not in tree}
    assert outside <= NOT_IN_TREE, outside - NOT_IN_TREE


def test_describe_names_the_type_and_never_comes_out_empty() -> None:
    """Issue 16 (logged errors said nothing: ``set_isr failed: `` and ``reading ZooKeeper
    failed ()``): ``describe`` names the type and never comes out empty."""

    assert describe(ConnectionLoss()) == "ConnectionLoss()"
    assert describe(TimeoutError()) == "TimeoutError()"
    assert describe(OSError(28, "No space left on device")) == (
        "OSError: [Errno 28] No space left on device"
    )
    assert describe(NotLeader("server 2 leads")) == "NotLeader: server 2 leads"


def test_the_new_error_is_retriable_with_its_own_code() -> None:
    """min_insync_replicas (docs/replication.md): NOT_ENOUGH_REPLICAS is retriable with its own
    code."""

    assert errors.ERRORS_BY_CODE[25] is NotEnoughReplicas
    assert errors.ERRORS_BY_NAME["NOT_ENOUGH_REPLICAS"] is NotEnoughReplicas
    assert NotEnoughReplicas.retriable and NotEnoughReplicas.http_status == 503
    assert not NotEnoughReplicas.invalid_metadata  # the leader is right; wait, not look up
