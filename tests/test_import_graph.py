"""The package's modules import one another without a circle and without reaching up the layers.

An import inside a function keeps a circle from failing at import time but not from being a circle: two
modules that need each other are one idea split in two, or a lower layer reaching up. The graph is read from
the source (mistill.import_graph: every `import` and `from ... import` statement, wherever it stands), so a
new circle or upward import fails here before anyone runs into it.
"""

from __future__ import annotations

from mistill.import_graph import LAYERS, circles, import_graph, layer, upward_imports

# The upward imports the package still has, each with why; the test fails on any other and on any of these
# gone (then strike it here), so the list only shrinks.
KNOWN_UPWARD = {
    # the λ grid runs `evaluate arm` on each cell through the command line's parser (docs/design.md "Layers")
    ("mistill.distill.selection_commands", "mistill.cli"),
    # the planted teacher marks the decision events as the instrument extracts them
    ("mistill.models.planted", "mistill.instrument.events"),
    # the proxy pass sets the objective's terms, computed by the student's loss code, against exact patches
    ("mistill.instrument.proxy", "mistill.distill.buckets"),
    ("mistill.instrument.proxy", "mistill.distill.mechanism"),
    ("mistill.instrument.proxy", "mistill.distill.objective"),
    ("mistill.instrument.proxy", "mistill.distill.pooled_attention"),
    ("mistill.instrument.proxy", "mistill.distill.targets"),
    # the readers' helpers write numbers files against the registry
    ("mistill.instrument.readout", "mistill.repro.numbers"),
    ("mistill.instrument.readout", "mistill.repro.registry"),
    ("mistill.evaluate.readout", "mistill.repro.numbers"),
    ("mistill.evaluate.readout", "mistill.repro.registry"),
}
ENTRY_POINTS = {"mistill.cli", "mistill.warm_server"}
BASE = {"mistill.errors", "mistill.params", "mistill.io"}


def write_package(root, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_an_import_inside_a_function_closes_a_circle(tmp_path):
    write_package(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "import pkg.b\n",
                             "pkg/b.py": "def f():\n    from pkg.a import g\n"})
    graph = import_graph(tmp_path / "pkg")
    assert graph.edges["pkg.b", "pkg.a"]["sites"][0].in_function
    assert circles(graph) == [["pkg.a", "pkg.b"]]


def test_relative_imports_resolve_and_a_named_submodule_is_the_edge(tmp_path):
    write_package(tmp_path, {"pkg/__init__.py": "VERSION = 1\n", "pkg/a.py": "from pkg import sub, VERSION\n",
                             "pkg/sub/__init__.py": "", "pkg/sub/b.py": "from . import c\nfrom ..a import f\n",
                             "pkg/sub/c.py": "from .. import a\n"})
    graph = import_graph(tmp_path / "pkg")
    assert set(graph.successors("pkg.a")) == {"pkg.sub", "pkg"}         # a package's name: its `__init__`
    assert set(graph.successors("pkg.sub.b")) == {"pkg.sub.c", "pkg.a"}
    assert set(graph.successors("pkg.sub.c")) == {"pkg.a"}               # `from .. import a`: the module a
    assert circles(graph) == []


def test_upward_imports_follow_the_layers(tmp_path):
    write_package(tmp_path, {"pkg/__init__.py": "", "pkg/low.py": "def f():\n    import pkg.high\n",
                             "pkg/high.py": "from pkg import low\n"})
    graph = import_graph(tmp_path / "pkg")
    assert upward_imports(graph, layers=(("low",), ("high",))) == [("pkg.low", "pkg.high")]


def test_no_module_of_the_package_imports_itself_back():
    graph = import_graph()
    assert "mistill.warm" in graph.successors("mistill.cli")   # the graph reads the real package
    assert circles(graph) == []


def test_every_module_stands_in_a_layer():
    assert all(layer(module) is not None or module == "mistill" for module in import_graph())
    named = [group for groups in LAYERS for group in groups]
    assert len(named) == len(set(named))


def test_the_command_line_is_imported_by_the_entry_points_alone():
    importers = set(import_graph().predecessors("mistill.cli"))
    assert importers - ENTRY_POINTS == {low for low, high in KNOWN_UPWARD if high == "mistill.cli"}


def test_the_base_utilities_import_only_one_another():
    graph = import_graph()
    assert {(m, n) for m in BASE for n in graph.successors(m) if layer(n) != 0} == set()


def test_no_other_import_runs_up_the_layers():
    upward = set(upward_imports(import_graph()))
    assert upward - KNOWN_UPWARD == set(), "imports of a higher layer by a lower one"
    assert KNOWN_UPWARD - upward == set(), "no longer imported: strike them from KNOWN_UPWARD"
