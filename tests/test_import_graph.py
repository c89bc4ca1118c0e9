"""The import graph between Flightdeck's parts: no cycles, and a pure analysis package.

Read from the source with `ast` (nothing is imported). Every import counts, the lazy ones inside
functions and those under `if TYPE_CHECKING:` too: a lazy import still makes its module need the
other, it only hides the cycle until the function runs. A node is a top-level package
(`flightdeck.collector`, `flightdeck.analysis`, ...) or a top-level module (`flightdeck.agent`,
`flightdeck.records`, ...). `flightdeck/{collector,server,web,dashboards}` are symbolic links to the
top-level folders: their files are read under their `flightdeck.*` names, the only names anything
in the repository may import them by (docs/architecture.md, "Why the top-level folders are links").
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "flightdeck"

#: Cycles between nodes allowed to stay, each with why it is there (none today: the server's
#: `WebData` lives in server/page_data.py, so web/ imports nothing of the server). A cycle not
#: listed fails the test; one listed that is gone fails it too, so the list only ever shrinks.
KNOWN_CYCLES: dict[frozenset[str], str] = {}

#: What the diagnosis may not reach, directly or through another module: it is pure (summaries in,
#: findings out), so the server, the web pages and the offline `flightdeck analyze` share it.
NOT_FROM_ANALYSIS = ("flightdeck.collector", "flightdeck.server", "flightdeck.web", "flightdeck.launch")

#: What the file-format readers may not reach: the collector, `flightdeck analyze` and the pages'
#: dump-file source all read through them, so they stand below every process that uses them.
NOT_FROM_READERS = (
    "flightdeck.collector",
    "flightdeck.server",
    "flightdeck.web",
    "flightdeck.dashboards",
    "flightdeck.launch",
)

#: Parts that read dump files without being the collector: they reach it through nothing.
NOT_THROUGH_COLLECTOR = ("flightdeck.analyze_cmd", "flightdeck.web")

#: The top-level folders that are also `flightdeck.<name>`: imported only by that name.
LINKED_FOLDERS = ("collector", "server", "web", "dashboards")

#: Where the repository's Python lives besides the package tree (which `_modules` walks).
OTHER_SOURCES = ("tests", "bench")


def _modules() -> Iterator[tuple[str, Path]]:
    """Every module of the package tree, with its dotted name (symbolic links followed)."""
    for dirpath, dirnames, filenames in os.walk(PACKAGE, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        rel = Path(dirpath).relative_to(PACKAGE)
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            parts = ["flightdeck", *rel.parts]
            if name != "__init__.py":
                parts.append(name.removesuffix(".py"))
            yield ".".join(parts), Path(dirpath) / name


def _node(module: str) -> str:
    """The node a module belongs to: `flightdeck.<top>` (a package or a module), or `flightdeck`."""
    parts = module.split(".")
    return ".".join(parts[:2])


def _imported(module: str, path: Path, known: set[str]) -> Iterator[str]:
    """The flightdeck modules `module` (at `path`) imports, anywhere in its body."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0] == "flightdeck")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.split(".")[0] != "flightdeck":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                # `from flightdeck import spool` imports the module; `from flightdeck import
                # __version__` imports the package.
                yield sub if sub in known else target


@cache
def _graph() -> dict[str, set[str]]:
    """Node -> the nodes it imports (itself left out); read once for all the tests (none changes it)."""
    modules = dict(_modules())
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        src = _node(module)
        edges = graph.setdefault(src, set())
        edges.update(_node(t) for t in _imported(module, path, known) if _node(t) != src)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp: set[str] = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for w in graph.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def test_the_graph_is_read() -> None:
    """The walk sees the parts behind the symbolic links, and their imports."""
    graph = _graph()
    for part in ("flightdeck.agent", "flightdeck.analysis", "flightdeck.collector", "flightdeck.server"):
        assert part in graph, sorted(graph)
    assert "flightdeck.spool" in graph["flightdeck.collector"]
    assert "flightdeck.spool" in graph["flightdeck.agent"]


def test_no_import_cycles_between_parts() -> None:
    """No two parts import each other, directly or round a longer loop (but the known ones)."""
    found = {c: " -> ".join(sorted(c)) for c in _cycles(_graph())}
    new = [text for c, text in found.items() if c not in KNOWN_CYCLES]
    gone = [" -> ".join(sorted(c)) for c in KNOWN_CYCLES if c not in found]
    assert not new, f"import cycles: {new}"
    assert not gone, f"known cycles that are gone (remove them from KNOWN_CYCLES): {gone}"


def test_analysis_is_pure() -> None:
    """The diagnosis reaches none of the collector, server, web pages or launchers."""
    reached = _reachable(_graph(), "flightdeck.analysis")
    assert not reached.intersection(NOT_FROM_ANALYSIS), sorted(reached.intersection(NOT_FROM_ANALYSIS))


def test_readers_stand_alone() -> None:
    """The file-format readers reach none of the collector, server, web pages, dashboards or
    launchers."""
    graph = _graph()
    assert "flightdeck.readers" in graph, sorted(graph)
    reached = _reachable(graph, "flightdeck.readers")
    assert not reached.intersection(NOT_FROM_READERS), sorted(reached.intersection(NOT_FROM_READERS))


def test_dump_readers_outside_the_collector_do_not_import_it() -> None:
    """`flightdeck analyze` and the pages read dumps through `flightdeck.readers`, not the collector."""
    graph = _graph()
    for part in NOT_THROUGH_COLLECTOR:
        assert part in graph, sorted(graph)
        assert "flightdeck.collector" not in _reachable(graph, part), part


def _bare_imports(path: Path) -> Iterator[str]:
    """`path`'s imports of a linked folder by its bare top-level name (`server.app`, not
    `flightdeck.server.app`), statements and `importlib.import_module("...")` calls alike."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        yield from (n for n in names if n.split(".")[0] in LINKED_FOLDERS)


def _repository_sources() -> Iterator[Path]:
    """Every Python file of the package tree (the linked folders through their links), the tests
    (their data left out) and the benchmarks."""
    yield from (path for _, path in _modules())
    for top in OTHER_SOURCES:
        for dirpath, dirnames, filenames in os.walk(ROOT / top):
            dirnames[:] = sorted(d for d in dirnames if d not in ("__pycache__", "data"))
            yield from (Path(dirpath) / n for n in sorted(filenames) if n.endswith(".py"))


def test_linked_folders_have_one_import_path() -> None:
    """Nothing imports `collector`, `server`, `web` or `dashboards` by the bare folder name.

    With the repository root on `sys.path` (pytest's `pythonpath`, or a script started from a
    checkout) `import server.app` would work too, and load a second copy of every module beside
    `flightdeck.server.app`: two sets of globals, two registries, `isinstance` failing across
    them, and an import that an installed wheel (which has no top-level `server`) cannot do.
    """
    sources = list(_repository_sources())
    assert any(p.parts[-2:] == ("server", "app.py") for p in sources)
    assert any(p.parts[-2:] == ("tests", "test_import_graph.py") for p in sources)
    found = [f"{path.relative_to(ROOT)}: {name}" for path in sources for name in _bare_imports(path)]
    assert not found, found
