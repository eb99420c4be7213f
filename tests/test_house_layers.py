"""The house's layers, read from the code's own imports (``ast``, every import statement, those inside functions too).

- Ground floor: ``wire/`` imports nothing of ours; ``runtime/`` only ``wire/``.
- ``meta/`` and ``broker/`` stand side by side on it and never import each other, ``ops/`` or ``migrations/``. The
  client stands on ``wire/`` only; meta may use it (a node reads its peers' history through the client's one history
  reader, meta/projection_gap.py), the broker does not.
- ``migrations/`` stands on meta (its env reads the projection's schema); ``ops/`` is the top floor.
- No two files import each other, directly or round a circle.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
OURS = ("wire", "runtime", "client", "meta", "broker", "migrations", "ops")
MAY_IMPORT = {
    "wire": {"wire"},
    "runtime": {"wire", "runtime"},
    "client": {"wire", "client"},
    "broker": {"wire", "runtime", "broker"},
    "meta": {"wire", "runtime", "client", "meta"},
    "migrations": {"wire", "runtime", "meta", "migrations"},
    "ops": set(OURS),
}


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: pathlib.Path) -> set[str]:
    """The modules of ours that ``path`` imports, as dotted names (a name imported from a package counts as its
    submodule when there is one)."""
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)
    return {m for m in found if m.split(".")[0] in OURS}


def source_files() -> dict[str, pathlib.Path]:
    files = {}
    for top in OURS:
        for p in (ROOT / top).rglob("*.py"):
            if "versions" not in p.relative_to(ROOT).parts:   # Alembic's scripts import nothing of ours
                files[module_name(p)] = p
    return files


def import_graph() -> dict[str, set[str]]:
    files = source_files()
    return {m: {t for t in imports_of(p) if t in files and t != m} for m, p in files.items()}


def test_every_floor_imports_only_what_stands_below_it():
    wrong = sorted(f"{m} imports {t}" for m, targets in import_graph().items() for t in targets
                   if t.split(".")[0] not in MAY_IMPORT[m.split(".")[0]])
    assert not wrong, "\n".join(wrong)


def test_no_module_of_the_broker_imports_meta():
    # Said on its own: a broker process must not load meta's code, not even through runtime/ or wire/.
    graph = import_graph()
    reached, todo = set(), [m for m in graph if m.split(".")[0] == "broker"]
    while todo:
        m = todo.pop()
        if m not in reached:
            reached.add(m)
            todo.extend(graph[m])
    assert not sorted(m for m in reached if m.split(".")[0] in ("meta", "ops", "migrations"))


def test_no_circle_of_files():
    graph = import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:   # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    # A package's __init__ that hands on names from its own modules is no circle of code; only modules count.
    circles = [c for c in circles if not any(source_files()[m].name == "__init__.py" for m in c)]
    assert not circles, circles


def test_the_graph_sees_imports():
    # The checks above pass on an empty graph: make sure the walk reads what it should.
    graph = import_graph()
    assert "wire.errors" in graph["runtime.server"] and "runtime.serve" in graph["meta.serve"]
    assert "broker.api.app" in graph["broker.serve"]
