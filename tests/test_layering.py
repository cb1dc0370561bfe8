"""The package's import structure, read from the source with ``ast``: no import
cycles between modules, and the layering of ARCHITECTURE.md.

* ``opgraph/`` (the core) imports nothing of passes/, backends/ or benchmarks/
  (its lazy ``compile`` / ``LoweringPolicy`` attributes are a string table that
  ``importlib`` resolves on first use, not an import statement);
* ``passes/`` imports the core, ``opgraph.backends.registry`` and itself;
* ``backends/`` imports the core, the registry and backend modules;
* ``benchmarks/`` may import everything.

Every import statement counts, at module level or inside a function, except
those under ``if TYPE_CHECKING:`` (annotations only). The registry loads the
backends with ``importlib.import_module("opgraph.backends")``, a string, so
the plug-in direction (registry -> backends) is not an edge either. The
modules are those setup.cfg installs: its ``packages`` mapped onto folders by
``package_dir``.
"""

from __future__ import annotations

import ast
import configparser
from pathlib import Path

import networkx as nx

REPO = Path(__file__).resolve().parents[1]

#: Imports against the layering that belong to other work:
#: ``(importing module, imported module): "why it is still there"``. Remove an
#: entry when its import goes (the last test fails while an entry is stale).
#: Empty: passes/compiler.py's import of backends.device went (registry.DeviceSupport).
ALLOWED: dict[tuple[str, str], str] = {}


def _packages() -> dict[str, Path]:
    """Package name -> folder, from setup.cfg."""
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    packages = cfg["options"]["packages"].split()
    dirs = dict(line.split("=", 1) for line in cfg["options"]["package_dir"].strip().splitlines())
    dirs = {k.strip(): v.strip() for k, v in dirs.items()}
    return {p: REPO / dirs.get(p, p.replace(".", "/")) for p in packages}


def _modules() -> dict[str, Path]:
    """Module name -> file of every module setup.cfg installs (``pkg`` for ``pkg/__init__.py``)."""
    out = {}
    for pkg, folder in _packages().items():
        for f in sorted(folder.glob("*.py")):
            out[pkg if f.stem == "__init__" else f"{pkg}.{f.stem}"] = f
    return out


MODULES = _modules()


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST):
    """Every Import / ImportFrom node, skipping the bodies of ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _targets(module: str, path: Path, node) -> set[str]:
    """The package modules ``node`` (in ``module``, file ``path``) imports: the
    most specific known module of each imported name."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
        return {n for n in names if n in MODULES}
    if node.level:
        base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    out = set()
    for alias in node.names:
        if f"{source}.{alias.name}" in MODULES:
            out.add(f"{source}.{alias.name}")
        elif source in MODULES:
            out.add(source)
    return out


def import_graph() -> nx.DiGraph:
    g = nx.DiGraph()
    for module, path in MODULES.items():
        g.add_node(module)
        for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            for target in _targets(module, path, node) - {module}:
                g.add_edge(module, target, line=node.lineno)
    return g


GRAPH = import_graph()


def _layer(module: str) -> str:
    for layer in ("passes", "backends", "benchmarks"):
        if module == f"opgraph.{layer}" or module.startswith(f"opgraph.{layer}."):
            return layer
    return "core"


def _allowed(module: str, target: str) -> bool:
    layer, to = _layer(module), _layer(target)
    if to == "core" or layer == "benchmarks" or layer == to:
        return True
    return layer == "passes" and target == "opgraph.backends.registry"


def test_every_package_folder_is_installed():
    folders = {folder.resolve() for folder in _packages().values()}
    for top in {"opgraph", "backends", "passes", "benchmarks"}:
        for init in (REPO / top).rglob("__init__.py"):
            assert init.parent.resolve() in folders, f"{init.parent} is missing from setup.cfg's packages"


def test_the_graph_sees_the_packages():
    assert len(MODULES) > 80
    assert GRAPH.has_edge("opgraph.passes.compiler", "opgraph.backends.registry")
    assert GRAPH.has_edge("opgraph.backends.cuda.cudnn_rules", "opgraph.backends.cuda.cudnn")


def test_no_import_cycles():
    cycles = [sorted(c) for c in nx.strongly_connected_components(GRAPH) if len(c) > 1]
    assert not cycles, "import cycles: " + "; ".join(
        " <-> ".join(c) + f" (e.g. {' -> '.join(nx.find_cycle(GRAPH.subgraph(c))[0][:2])})" for c in cycles)


def test_layering():
    bad = sorted((m, t) for m, t in GRAPH.edges if not _allowed(m, t) and (m, t) not in ALLOWED)
    assert not bad, "imports against the layering: " + "; ".join(
        f"{m} -> {t} (line {GRAPH.edges[m, t]['line']})" for m, t in bad)


def test_every_allowed_exception_is_still_needed():
    stale = [edge for edge in ALLOWED if not GRAPH.has_edge(*edge)]
    assert not stale, f"no longer imported, remove from ALLOWED: {stale}"
