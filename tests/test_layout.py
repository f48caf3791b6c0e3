"""The house's layout: no import circle, each wing imports only what it may, no module
too long to read (docs/architecture.md draws the map; docs/decisions.md says why)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cronjob", "lease", "execctx")
LINE_LIMIT = 500
#: Modules still over the limit, with their length today: each to be split by concern.
#: The test fails if one grows, or once it fits (then it leaves this list).
NOT_YET_SPLIT: dict[str, int] = {}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _in_cronjob(name: str) -> bool:
    return name == "cronjob" or name.startswith("cronjob.")


def _imports(name: str, path: Path, *, typing_too: bool = False) -> set[str]:
    """The modules of our packages that ``name`` imports: at module level and inside
    functions; under ``if TYPE_CHECKING:`` only with ``typing_too`` (never executed, so
    such an import makes no import order matter, but it still ties the two modules: a part
    that names its caller's class depends on it). ``from package import name`` counts as
    importing the submodule when there is one, else the package."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if (
                not typing_too
                and isinstance(child, ast.If)
                and "TYPE_CHECKING" in ast.unparse(child.test)
            ):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package[: len(package) - child.level + 1]
                    module = ".".join(base + ([child.module] if child.module else []))
                else:
                    module = child.module or ""
                for alias in child.names:
                    sub = f"{module}.{alias.name}"
                    found.add(sub if sub in MODULES else module)
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return {target for target in found if target in MODULES and target != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}
#: The imports of ``cronjob`` with those under ``if TYPE_CHECKING:`` too.
TYPED_GRAPH = {
    name: {target for target in _imports(name, path, typing_too=True) if _in_cronjob(target)}
    for name, path in MODULES.items()
    if _in_cronjob(name)
}


def _circles(graph: dict[str, set[str]]) -> list[str]:
    """Each circle of ``graph`` found by a depth-first walk, as ``a -> b -> a``."""
    circles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(name: str) -> None:
        state[name] = 1
        path.append(name)
        for target in sorted(graph.get(name, ())):
            if state.get(target) == 1:
                circles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                walk(target)
        path.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name)
    return circles


def test_no_module_imports_itself_back_through_a_circle():
    assert _circles(GRAPH) == []


def test_no_circle_in_cronjob_even_through_type_only_imports():
    """A part hands its caller nothing by importing it, not even for a hint: the façade
    hands each part its ports (``cronjob/engine/_ports.py``, docs/decisions.md)."""
    assert _circles(TYPED_GRAPH) == []


def test_a_type_only_import_counts_in_the_typed_graph(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from cronjob.engine._dispatcher import Dispatcher\n",
        encoding="utf-8",
    )
    assert _imports("cronjob.engine._x", source) == set()
    assert _imports("cronjob.engine._x", source, typing_too=True) == {"cronjob.engine._dispatcher"}


class TestTheCircleFinder:
    """The finder the layout tests rely on, on graphs made up for it."""

    def test_it_finds_a_circle_through_three_modules(self):
        graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
        assert _circles(graph) == ["a -> b -> c -> a"]

    def test_it_finds_a_module_importing_itself_back_at_once(self):
        assert _circles({"a": {"b"}, "b": {"a"}}) == ["a -> b -> a"]

    def test_it_finds_no_circle_in_a_diamond(self):
        graph = {"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}
        assert _circles(graph) == []


def _wing(name: str) -> str:
    if name.startswith("cronjob.engine"):
        return "engine"
    if name.startswith("cronjob.admin"):
        return "admin"
    return name if name in ("cronjob", "cronjob.web", "cronjob.testing") else "face"


@pytest.mark.parametrize(
    ("wing", "forbidden"),
    [
        # The engine runs rounds: it never reaches into the operator's side, nor into the
        # package that re-exports it.
        ("engine", {"admin", "cronjob", "cronjob.web", "cronjob.testing"}),
        # The operator's side reads the tables; it may use the engine's database helpers
        # and the Scheduler (cronjob run), never the package façade.
        ("admin", {"cronjob", "cronjob.testing"}),
    ],
)
def test_each_wing_imports_only_what_it_may(wing, forbidden):
    wrong = sorted(
        f"{name} -> {target}"
        for name, targets in GRAPH.items()
        if _wing(name) == wing
        for target in targets
        if _wing(target) in forbidden
    )
    assert wrong == []


def test_nothing_outside_the_engine_imports_its_private_modules():
    """The rest of ``cronjob`` takes what it uses of the engine from ``cronjob.engine``
    (its ``__init__`` re-exports it), never from an ``engine._x`` module: what the other
    packages lean on is listed in one place. Imports for type checking count too."""
    wrong = sorted(
        f"{name} -> {target}"
        for name, targets in TYPED_GRAPH.items()
        if _wing(name) != "engine"
        for target in targets
        if target.startswith("cronjob.engine._")
    )
    assert wrong == []


def test_the_building_blocks_import_neither_wing():
    """The public face's blocks (``__main__``, ``_lifespan``, ``testing``, ``contrib`` may
    use the wings), and the lease and execctx packages, stand below both wings."""
    face = ("cronjob.__main__", "cronjob._lifespan", "cronjob.pytest_plugin")
    blocks = [n for n in GRAPH if n.startswith("cronjob._") and n not in face]
    blocks += [n for n in GRAPH if n.startswith(("lease", "execctx"))]
    wrong = sorted(
        f"{name} -> {target}"
        for name in blocks
        for target in GRAPH[name]
        if _wing(target) in ("engine", "admin")
    )
    assert wrong == []


def test_no_module_is_longer_than_the_limit():
    lengths = {
        name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in MODULES.items()
    }
    over = {name: n for name, n in lengths.items() if n > LINE_LIMIT}
    grown = {name: n for name, n in over.items() if n > NOT_YET_SPLIT.get(name, LINE_LIMIT)}
    fitting = sorted(name for name in NOT_YET_SPLIT if lengths[name] <= LINE_LIMIT)
    assert grown == {}, "over the limit (split by concern)"
    assert fitting == [], "now within the limit: take it off NOT_YET_SPLIT"
