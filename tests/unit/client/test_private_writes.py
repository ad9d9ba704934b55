"""No module of the SDK (pidlease/client) assigns another object's private attribute
(``other._x = ...``): a class's private fields are written by its own methods, and what
others may set is public (``RecordFuture.batch_outcome``) or a method (``Connection.attach``).
Read from the source, so a new shortcut on a fast path fails here by line."""

from __future__ import annotations

import ast
from pathlib import Path

CLIENT = Path(__file__).resolve().parents[3] / "pidlease" / "client"


def _private_writes(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        else:
            continue
        for target in targets:
            for sub in ast.walk(target):
                own = (
                    isinstance(sub, ast.Attribute)
                    and isinstance(sub.value, ast.Name)
                    and sub.value.id in ("self", "cls")
                )
                if (
                    isinstance(sub, ast.Attribute)
                    and sub.attr.startswith("_")
                    and not sub.attr.startswith("__")
                    and not own
                ):
                    out.append(f"{path.name}:{node.lineno}: {ast.unparse(target)}")
    return out


def test_the_client_writes_no_other_objects_private_fields() -> None:
    files = sorted(CLIENT.glob("*.py"))
    assert len(files) > 10
    assert [w for f in files for w in _private_writes(f)] == []
