"""The package's modules import one another without a circle, counting the imports inside functions too.

An import inside a function keeps a circle from failing at import time but not from being a circle: two
modules that need each other are one idea split in two, or a lower layer reaching up. The graph is read from
the source (every `import` and `from ... import` statement, wherever it stands), so a new circle fails here
before anyone runs into it.
"""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


def module_name(path: Path, src: Path) -> str:
    parts = path.relative_to(src).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, name: str, modules: set[str]) -> set[str]:
    """The package's modules that the file at `path` (module `name`) imports anywhere in its body."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            base = ".".join(package[:len(package) - node.level + 1]) if node.level else ""
            target = ".".join(p for p in (base, node.module or "") if p)
            # `from a import b`: module a.b when there is one, else a name of module a
            candidates = [f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target
                          for alias in node.names]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in modules:   # `import a.b.c` of a package's name: its module
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                found.add(candidate)
    return found


def module_graph(src: Path) -> dict[str, set[str]]:
    paths = {module_name(p, src): p for p in src.rglob("*.py")}
    return {name: imported_modules(path, name, set(paths)) for name, path in paths.items()}


def test_the_graph_reads_every_kind_of_import(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    for name in ("__init__.py", "a.py", "sub/__init__.py", "sub/b.py", "sub/c.py"):
        (package / name).write_text("")
    (package / "a.py").write_text("import pkg.sub.b\n\ndef f():\n    from pkg.sub import c\n")
    (package / "sub" / "b.py").write_text("from . import c\nfrom ..a import f\n")
    graph = module_graph(tmp_path)
    assert graph["pkg.a"] == {"pkg.sub.b", "pkg.sub.c"}       # the function's import counts
    assert graph["pkg.sub.b"] == {"pkg.sub.c", "pkg.a"}       # relative imports resolved
    with pytest.raises(CycleError):
        TopologicalSorter(graph).prepare()                     # a -> b -> a


def test_no_module_of_the_package_imports_itself_back():
    graph = module_graph(SRC)
    assert "mistill.cli" in graph and "mistill.warm" in graph["mistill.cli"]
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as err:
        pytest.fail(f"import circle: {' -> '.join(err.args[1])}")
