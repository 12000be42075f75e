"""The package's internal imports as a graph of modules, its circles, and the imports that run up the layers.

Every `import` and `from ... import` statement of every module counts, wherever it stands: an import inside a
function keeps a circle from failing at import time but not from being a circle, and two modules that need
each other are one idea split in two or a lower layer reaching up. The graph is read from the source with
`ast`, so a new circle or upward import shows before anyone runs into it (tests/test_import_graph.py).

An edge goes to the module named: `from pkg import sub` to the submodule `pkg.sub` when there is one, else to
the package's `__init__` module (named `pkg`); relative imports resolve against the importing module's package.
Imports loaded by a name computed at run time (`importlib.import_module`) are not statements and show no edge.

`LAYERS` is docs/design.md's list "src/mistill — layers" in its order, the base first: a module may import its
own layer and those listed before it. An import of a layer listed after its own is an upward import: the base
leaning on what is built on it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # networkx is imported where a graph is built: the warm server imports every module
    import networkx as nx

PACKAGE_DIR = Path(__file__).resolve().parent

# each entry a layer, named by the first names below `mistill` of its modules (a group package or a module of
# the root)
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "params", "io", "shard", "import_graph"),   # the root's utilities, which every layer may use
    ("stats",),
    ("world",),
    ("models",),
    ("instrument", "control"),
    ("distill", "baselines"),
    ("evaluate", "simulator", "locus"),
    ("warm",),   # the warm interpreter names the architectures' modules (models); `mistill repro warm` starts it
    ("repro", "rehearsal"),
    ("cli", "warm_server"),   # the entry points: `mistill` and the warm interpreter's process
)


@dataclass(frozen=True)
class ImportSite:
    """One import statement: where it stands, and whether a function body holds it."""

    path: Path
    line: int
    in_function: bool


def module_names(package_dir: Path) -> dict[str, Path]:
    """Every module under `package_dir` by its dotted name (a package's `__init__.py` by the package's name)."""
    root = package_dir.parent
    names = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _statements(tree: ast.AST):
    """Each import statement of `tree` with whether it stands inside a function."""
    stack = [(tree, False)]
    while stack:
        node, in_function = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, in_function
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        stack.extend((child, inner) for child in ast.iter_child_nodes(node))


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The module that `name` lives in: itself, or the nearest enclosing module (`a.b.c` of a module `a.b`)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imported_modules(name: str, modules: dict[str, Path]) -> dict[str, list[ImportSite]]:
    """The modules of `modules` that module `name` imports, each with the statements that import it."""
    path = modules[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, list[ImportSite]] = {}
    for node, in_function in _statements(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = {_known(alias.name, modules) for alias in node.names}
        else:
            source = node.module or ""
            if node.level:   # `from ..a import b` in package p.q.r: p.q.a
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, source] if source else base)
            # `from a import b`: the module a.b when there is one, else a name that module a defines
            targets = {f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else _known(source, modules)
                       for alias in node.names}
        for target in sorted(t for t in targets if t is not None):
            if target != name:
                found.setdefault(target, []).append(ImportSite(path, node.lineno, in_function))
    return found


def import_graph(package_dir: Path = PACKAGE_DIR) -> nx.DiGraph:
    """The package's modules and an edge for each module that one imports (attribute `sites`: the statements)."""
    modules = module_names(package_dir)
    import networkx as nx

    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name in modules:
        for target, sites in imported_modules(name, modules).items():
            graph.add_edge(name, target, sites=sites)
    return graph


def circles(graph: nx.DiGraph) -> list[list[str]]:
    """The sets of modules that reach one another through imports (strongly connected, more than one module)."""
    import networkx as nx

    return sorted(sorted(component) for component in nx.strongly_connected_components(graph) if len(component) > 1)


def layer(module: str, layers: tuple[tuple[str, ...], ...] = LAYERS) -> int | None:
    """The layer of `module` by its first name below the package (None for the package's own `__init__`)."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    for rank, groups in enumerate(layers):
        if parts[1] in groups:
            return rank
    raise ValueError(f"{module}: its group {parts[1]!r} stands in no layer of mistill.import_graph.LAYERS")


def upward_imports(graph: nx.DiGraph, layers: tuple[tuple[str, ...], ...] = LAYERS) -> list[tuple[str, str]]:
    """The imports of a layer listed after the importer's own, as (importer, imported)."""
    upward = []
    for importer, imported in graph.edges:
        low, high = layer(importer, layers), layer(imported, layers)
        if low is not None and high is not None and high > low:
            upward.append((importer, imported))
    return sorted(upward)
