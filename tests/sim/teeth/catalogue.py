"""The bug files of ``bugs/``: read them, and check that their patches still apply.

One bug per file, named ``<origin>_<slug>.py``, holding only constants::

    TITLE = "one line: what the bug did"
    ORIGIN = "docs/reliability.md sim finding 12"
    PATCHES = [("partition_server/partition.py", "old exact text", "new text")]
    SEARCH = "sim"                  # or "pytest"
    SIM_ARGS = ["--retention"]      # extra args of `python -m tests.sim run`
    PYTEST = ""                     # a node id that must FAIL with the patch (SEARCH "pytest")
    BUDGET = 3000                   # seeds the simulation may take to find it
    WHY_NOT_SIM = ""                # SEARCH != "sim": why the simulation cannot find it
    EXPECTED = "found"              # optional; "not found": the search is known to miss it

The patches are applied in order; each ``old`` must occur exactly once in its file as
the earlier patches left it, else the catalogue is stale and the runner says which.
The files are parsed with ``ast`` and their values read with ``ast.literal_eval``: a
bug file runs no code."""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field

BUGS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bugs")

SEARCHES = ("sim", "pytest")
EXPECTATIONS = ("found", "not found")
_REQUIRED = ("TITLE", "ORIGIN", "PATCHES", "SEARCH", "BUDGET")
_OPTIONAL = ("SIM_ARGS", "PYTEST", "WHY_NOT_SIM", "EXPECTED")


class CatalogueError(Exception):
    """A bug file that cannot be read, or a patch that no longer applies (stale)."""


@dataclass(frozen=True)
class Bug:
    name: str  # the file name without .py
    title: str
    origin: str
    patches: list[tuple[str, str, str]]
    search: str
    budget: int
    sim_args: list[str] = field(default_factory=list)
    pytest: str = ""
    why_not_sim: str = ""
    expected: str = "found"

    @property
    def sim_start(self) -> int:
        """The first seed the search runs (``--start`` in SIM_ARGS, else 0)."""
        args = self.sim_args
        for i, a in enumerate(args):
            if a == "--start" and i + 1 < len(args):
                return int(args[i + 1])
            if a.startswith("--start="):
                return int(a.split("=", 1)[1])
        return 0


def _constants(path: str) -> dict[str, object]:
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    out: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value  # SIM_ARGS: list[str] = [] (for mypy)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        else:
            raise CatalogueError(f"{path}:{node.lineno}: only NAME = constant assignments allowed")
        if not isinstance(target, ast.Name):
            raise CatalogueError(f"{path}:{node.lineno}: only NAME = constant assignments allowed")
        name = target.id
        if name not in _REQUIRED + _OPTIONAL:
            raise CatalogueError(f"{path}:{node.lineno}: unknown name {name}")
        try:
            out[name] = ast.literal_eval(value)
        except ValueError as e:
            raise CatalogueError(f"{path}:{node.lineno}: {name} is not a constant ({e})") from e
    return out


def load_bug(path: str) -> Bug:
    c = _constants(path)
    name = os.path.basename(path)[: -len(".py")]
    missing = [k for k in _REQUIRED if k not in c]
    if missing:
        raise CatalogueError(f"{path}: missing {', '.join(missing)}")
    patches = c["PATCHES"]
    if (
        not isinstance(patches, list | tuple)
        or not patches
        or not all(
            isinstance(p, tuple | list) and len(p) == 3 and all(isinstance(s, str) for s in p)
            for p in patches
        )
    ):
        raise CatalogueError(f"{path}: PATCHES must be a non-empty list of (file, old, new)")
    bug = Bug(
        name=name,
        title=str(c["TITLE"]),
        origin=str(c["ORIGIN"]),
        patches=[(str(p[0]), str(p[1]), str(p[2])) for p in patches],
        search=str(c["SEARCH"]),
        budget=int(c["BUDGET"]),  # type: ignore[call-overload]
        sim_args=[str(a) for a in c.get("SIM_ARGS", [])],  # type: ignore[attr-defined]
        pytest=str(c.get("PYTEST", "")),
        why_not_sim=str(c.get("WHY_NOT_SIM", "")),
        expected=str(c.get("EXPECTED", "found")),
    )
    if bug.search not in SEARCHES:
        raise CatalogueError(f"{path}: SEARCH {bug.search!r} is not one of {SEARCHES}")
    if bug.expected not in EXPECTATIONS:
        raise CatalogueError(f"{path}: EXPECTED {bug.expected!r} is not one of {EXPECTATIONS}")
    if bug.search == "pytest" and not (bug.pytest and bug.why_not_sim):
        raise CatalogueError(f"{path}: SEARCH 'pytest' needs PYTEST and WHY_NOT_SIM")
    if bug.expected == "not found" and not bug.why_not_sim:
        raise CatalogueError(f"{path}: EXPECTED 'not found' needs WHY_NOT_SIM (say why)")
    if bug.budget <= 0 and bug.search == "sim":
        raise CatalogueError(f"{path}: BUDGET must be positive")
    for f, old, _new in bug.patches:
        if os.path.isabs(f) or ".." in f.split("/") or not old:
            raise CatalogueError(f"{path}: patch of {f!r}: a relative path and a non-empty old")
    return bug


def load_all(bugs_dir: str = BUGS_DIR) -> list[Bug]:
    names = sorted(n for n in os.listdir(bugs_dir) if n.endswith(".py") and not n.startswith("__"))
    return [load_bug(os.path.join(bugs_dir, n)) for n in names]


def patched_texts(bug: Bug, root: str) -> dict[str, str]:
    """The new text of every file the bug patches, from the files under ``root``; raises
    CatalogueError naming the patch whose ``old`` does not occur exactly once."""
    texts: dict[str, str] = {}
    for i, (f, old, new) in enumerate(bug.patches):
        if f not in texts:
            p = os.path.join(root, f)
            if not os.path.isfile(p):
                raise CatalogueError(f"{bug.name}: patch {i + 1}: no file {f} (stale catalogue)")
            with open(p, encoding="utf-8") as fh:
                texts[f] = fh.read()
        n = texts[f].count(old)
        if n != 1:
            raise CatalogueError(
                f"{bug.name}: patch {i + 1}: the old text occurs {n} times in {f}, "
                f"not once (stale catalogue): {old[:120]!r}"
            )
        texts[f] = texts[f].replace(old, new)
    return texts


def apply(bug: Bug, root: str) -> None:
    """Apply the bug's patches to the copy at ``root`` (all or nothing)."""
    for f, text in patched_texts(bug, root).items():
        with open(os.path.join(root, f), "w", encoding="utf-8") as fh:
            fh.write(text)
