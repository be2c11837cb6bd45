#!/usr/bin/env python3
"""Usage: utils/dev/import_graph.py [--rooms-only] [--json]

Prints the import graph of the project's Python under utils/: first between rooms (a package such as
utils/diagnosis/ or utils/sweep/, a module that others import such as utils/trust.py, and "commands",
the thin commands in utils/ that nothing imports), then between files. Every import counts, the ones
inside a function too (they run when it is called); an import under `if TYPE_CHECKING:` does not
(it never runs). Imports of the standard library and other installed packages are left out.

Exit 1 when a circle joins rooms or files, or when a forbidden arrow exists (diagnosis reads what a
job left behind; it never imports the monitor or the sweep, which sit above it); each problem is one
line on stderr. Exit 0 otherwise. Standard library only: it runs under any python3 3.8 or newer.

  --rooms-only   print the rooms' graph and skip the files' (the checks still cover both)
  --json         {"rooms": {ROOM: [ROOM, ...]}, "files": {FILE: [FILE, ...]}, "problems": [...]}
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

UTILS = Path(__file__).resolve().parents[1]
# room -> rooms it must never import
FORBIDDEN = {"diagnosis": ("monitor", "sweep")}
COMMANDS = "commands"


def modules(utils: Path) -> dict[str, Path]:
    """Every importable module under UTILS by dotted name (a package by its __init__.py)."""
    found = {}
    for path in sorted(utils.rglob("*.py")):
        rel = path.relative_to(utils)
        if any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if not parts or not all(p.isidentifier() for p in parts):
            continue
        name = ".".join(parts)
        if len(rel.parts) == 1 and (utils / name / "__init__.py").exists():
            name += ".py"  # a thin command named as a package (utils/sweep.py): Python imports the package
        found[name] = path
    return found


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_names(tree: ast.AST, package: str) -> list[str]:
    """Dotted names TREE imports (`from P import a` gives P.a: a module, or a name in P), skipping
    TYPE_CHECKING blocks; PACKAGE resolves relative imports."""
    names = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)] if package else []
                base = ".".join([*up, base] if base else up)
            names.extend(f"{base}.{alias.name}" if base else alias.name for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


def file_graph(utils: Path) -> dict[str, set[str]]:
    """module -> the project's modules it imports."""
    mods = modules(utils)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for imported in imported_names(ast.parse(path.read_text(), str(path)), package):
            # the longest project module that the name starts with (P.a a module, else P itself)
            parts = imported.split(".")
            while parts and ".".join(parts) not in mods:
                parts.pop()
            if parts and ".".join(parts) != name:
                targets.add(".".join(parts))
        graph[name] = targets
    return graph


def room_of(module: str, imported: set[str]) -> str:
    """A package's room is its top folder; a top-level module that others import is a room of its
    own; the other top-level modules are the thin commands."""
    top = module.split(".")[0]
    if module.endswith(".py"):
        return COMMANDS
    if "." in module or module in imported:
        return top
    return COMMANDS


def room_graph(files: dict[str, set[str]]) -> dict[str, set[str]]:
    imported = {t for ts in files.values() for t in ts}
    rooms: dict[str, set[str]] = {}
    for src, targets in files.items():
        r = room_of(src, imported)
        rooms.setdefault(r, set())
        for t in targets:
            if room_of(t, imported) != r:
                rooms[r].add(room_of(t, imported))
    return rooms


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), or a node importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(max(1000, 10 * len(graph)))

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def problems(files: dict[str, set[str]], rooms: dict[str, set[str]]) -> list[str]:
    found = [f"a circle between rooms: {' <-> '.join(c)}" for c in circles(rooms)]
    found += [f"a circle between files: {' <-> '.join(c)}" for c in circles(files)]
    imported = {t for ts in files.values() for t in ts}
    for src, targets in sorted(files.items()):
        for t in sorted(targets):
            if room_of(t, imported) in FORBIDDEN.get(room_of(src, imported), ()):
                found.append(f"a forbidden arrow: {src} imports {t} ({room_of(src, imported)} never imports it)")
    return found


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"]):
        print((__doc__ or "").strip())
        return 0
    unknown = [a for a in argv if a not in ("--rooms-only", "--json")]
    if unknown:
        print(f"import_graph.py: unknown option {unknown[0]} (see import_graph.py --help)", file=sys.stderr)
        return 2
    files = file_graph(UTILS)
    rooms = room_graph(files)
    found = problems(files, rooms)
    if "--json" in argv:
        print(
            json.dumps(
                {
                    "rooms": {r: sorted(t) for r, t in sorted(rooms.items())},
                    "files": {f: sorted(t) for f, t in sorted(files.items())},
                    "problems": found,
                },
                indent=1,
            )
        )
    else:
        print("rooms:")
        for r, targets in sorted(rooms.items()):
            print(f"  {r} -> {', '.join(sorted(targets)) or '(nothing)'}")
        if "--rooms-only" not in argv:
            print("files:")
            for f, targets in sorted(files.items()):
                if targets:
                    print(f"  {f} -> {', '.join(sorted(targets))}")
    for p in found:
        print(f"import_graph.py: {p}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
