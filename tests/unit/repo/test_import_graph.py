"""The import graph of the project's packages, read from the source (no import runs): no
module imports itself back through others (a cycle makes the import order matter and
hides which module owns what), and the servers stay apart from the SDK, the CLI and the
test tools (they import only ``pidlease.wire`` and ``pidlease.errors``).

Every ``import``/``from ... import`` counts, at top level, inside a function, and under
``if TYPE_CHECKING:`` too: such a cycle does not break the import, but it still means two
modules know each other (the producer engine had one, ``producer`` <-> ``sender``).
``from a.b import c`` is an edge to the
module ``a.b.c`` when there is one, else to ``a.b``. Importing ``a.b.c`` also runs the
``__init__`` of ``a`` and ``a.b`` first; those implicit child-to-parent edges are not
drawn (a package's ``__init__`` that imported one of its children would still show up, as
an edge from the parent).

The same check by hand: ``python -m tests.unit.repo.test_import_graph`` prints every cycle and
every forbidden import, or "no cycles".
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("pidlease", "coordinator", "partition_server")
SERVERS = ("coordinator", "partition_server")
NOT_FOR_SERVERS = ("pidlease.client", "pidlease.cli", "pidlease.testing")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            out[_module_name(path)] = path
    return out


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of a module, wherever it is."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


def _targets(
    node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: dict[str, Path]
) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
        return
    base = node.module or ""
    if node.level:  # relative: from the importing module's package, `level` up
        pkg = module.split(".") if is_package else module.split(".")[:-1]
        pkg = pkg[: len(pkg) - (node.level - 1)]
        base = ".".join([*pkg, base] if base else pkg)
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        yield sub if sub in known else base


def import_graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports."""
    known = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        edges = graph.setdefault(module, set())
        for node in _import_nodes(tree):
            for target in _targets(node, module, path.name == "__init__.py", known):
                if target in known and target != module:
                    edges.add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as a
    sorted list of its modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def forbidden_server_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted(
        (m, t)
        for m, targets in graph.items()
        if m.split(".")[0] in SERVERS
        for t in targets
        if any(t == n or t.startswith(n + ".") for n in NOT_FOR_SERVERS)
    )


def test_the_graph_sees_the_known_edges() -> None:
    # guards the reader itself: a parser that found nothing would pass every check below
    g = import_graph()
    assert "pidlease.client.sender" in g["pidlease.client.producer"]
    assert "pidlease.wire.protocol" in g["partition_server.server"]
    assert "pidlease.errors" in g["pidlease.client.sender"]  # `from pidlease import errors`
    assert len(g) > 80


def test_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_the_servers_do_not_import_the_sdk_the_cli_or_the_test_tools() -> None:
    assert forbidden_server_imports(import_graph()) == []


if __name__ == "__main__":
    g = import_graph()
    found = cycles(g)
    for comp in found:
        print("cycle:", " <-> ".join(comp))
    for m, t in forbidden_server_imports(g):
        print(f"forbidden: {m} imports {t}")
    print(
        f"{len(g)} modules, {sum(map(len, g.values()))} imports, {len(found)} cycles"
        if found
        else f"{len(g)} modules, no cycles"
    )
