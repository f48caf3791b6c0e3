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


def _imports(name: str, path: Path) -> set[str]:
    """The modules of our packages that ``name`` imports when it runs: at module level and
    inside functions, but not under ``if TYPE_CHECKING:`` (never executed, so it cannot
    make an import order matter). ``from package import name`` counts as importing the
    submodule when there is one, else the package."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
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


def test_no_module_imports_itself_back_through_a_circle():
    circles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(name: str) -> None:
        state[name] = 1
        path.append(name)
        for target in sorted(GRAPH[name]):
            if state.get(target) == 1:
                circles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                walk(target)
        path.pop()
        state[name] = 2

    for name in sorted(GRAPH):
        if name not in state:
            walk(name)
    assert circles == []


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
