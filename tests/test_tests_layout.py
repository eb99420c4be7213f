"""The test tree's layout, read from its own imports (``ast``, every import statement, those inside functions too,
and the ``python -c`` children's source held in strings): a test module never imports another test module, and
tests/support/ (the shared helpers) imports none at all. A helper two modules need lives in tests/support/."""

from __future__ import annotations

import ast
import pathlib
import re

TESTS = pathlib.Path(__file__).resolve().parent
TEST_MODULE = re.compile(r"^tests\.test_\w+")


def imported_modules(path: pathlib.Path, package: str) -> set[str]:
    """Dotted names of what ``path`` imports (a name imported from a package counts as its submodule too)."""
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    trees = [tree]
    for node in ast.walk(tree):   # a child process's script: a string that parses and imports something of ours
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "import" in node.value:
            try:
                trees.append(ast.parse(node.value))
            except SyntaxError:
                pass
    for t in trees:
        for node in ast.walk(t):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = parts[:len(parts) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                found.add(target)
                found.update(f"{target}.{a.name}" for a in node.names)
    return found


def imported_test_modules(path: pathlib.Path, package: str) -> list[str]:
    return sorted(m for m in imported_modules(path, package) if TEST_MODULE.match(m))


def test_no_test_module_imports_another_test_module():
    here = pathlib.Path(__file__).resolve()   # its own cases below name test modules on purpose
    offenders = {p.name: imported_test_modules(p, "tests") for p in sorted(TESTS.glob("*.py")) if p != here}
    offenders = {name: mods for name, mods in offenders.items() if mods}
    assert offenders == {}, f"move the shared helpers to tests/support/: {offenders}"


def test_support_imports_no_test_module():
    support = sorted((TESTS / "support").rglob("*.py"))
    assert support, "tests/support/ holds the shared helpers"
    offenders = {str(p.relative_to(TESTS)): imported_test_modules(p, "tests.support") for p in support}
    offenders = {name: mods for name, mods in offenders.items() if mods}
    assert offenders == {}, f"tests/support/ must not lean on a test module: {offenders}"
    assert not [p for p in support if p.name.startswith("test_")], "no test module lives in tests/support/"


def test_the_walk_sees_every_kind_of_import(tmp_path):
    """The check itself: absolute, relative, inside a function, and in a child's script."""
    cases = {
        "from tests.test_config import meta_raw": ["tests.test_config", "tests.test_config.meta_raw"],
        "from .test_config import meta_raw": ["tests.test_config", "tests.test_config.meta_raw"],
        "from . import test_config": ["tests.test_config"],
        "import tests.test_config": ["tests.test_config"],
        "def f():\n    from tests.test_config import meta_raw\n": ["tests.test_config", "tests.test_config.meta_raw"],
        'CHILD = """\nfrom tests.test_storage import payload\n"""':
            ["tests.test_storage", "tests.test_storage.payload"],
        "from tests.support.config_files import meta_raw": [],
    }
    for source, expected in cases.items():
        path = tmp_path / "test_x.py"
        path.write_text(source)
        assert imported_test_modules(path, "tests") == expected, source
