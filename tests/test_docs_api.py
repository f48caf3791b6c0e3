"""The API reference (docs/reference/api/) covers every public module, and what it shows of
a module's docstring is written for its readers.

A module is public when no part of its dotted name starts with ``_``; the exceptions are
named below with the reason. mkdocstrings renders a module's docstring as Markdown at the
top of its page, so a reStructuredText literal marker (``::``) shows raw, a Sphinx role
shows raw, and notes on the private modules behind it speak to its maintainers, not its
users: those belong in a comment.
"""

from __future__ import annotations

import ast
import difflib
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
API = REPO / "docs" / "reference" / "api"

#: Public by name, without an API page, and why.
NOT_REFERENCE = {
    # Its docstring says so: every public name of the engine is re-exported by `cronjob`.
    "cronjob.engine": "internal",
    # `python -m cronjob`: the command, documented in docs/reference/cli.md.
    "cronjob.__main__": "the command",
    # Django's discovery of `manage.py cronjob`: the command, documented on the Django page.
    "cronjob.contrib.django.management": "the command",
    "cronjob.contrib.django.management.commands": "the command",
    "cronjob.contrib.django.management.commands.cronjob": "the command",
    # Django's record of the unmanaged model: no API, read by `manage.py migrate`.
    "cronjob.contrib.django.migrations": "Django's migrations",
    "cronjob.contrib.django.migrations.0001_initial": "Django's migrations",
}


def public_modules() -> list[str]:
    """Every module of the three import packages whose dotted name has no private part."""
    found = []
    for package in ["cronjob", "lease", "execctx"]:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            if any(part.startswith("_") and part != "__main__" for part in parts):
                continue
            found.append(".".join(parts))
    return found


def rendered() -> dict[str, str]:
    """Each name a page of the API reference renders with ``::: name``, and its page."""
    return {
        name: page.name
        for page in sorted(API.glob("*.md"))
        for name in re.findall(r"^::: ([\w.]+)$", page.read_text(), re.M)
    }


def documented_modules() -> dict[str, str]:
    """Each module a page renders, whole (``::: cronjob.admin``) or by its names
    (``::: cronjob.register``), and the page."""
    modules = set(public_modules())
    found: dict[str, str] = {}
    for name, page in rendered().items():
        while name not in modules and "." in name:
            name = name.rpartition(".")[0]
        found.setdefault(name, page)
    return found


def docstring(module: str) -> str:
    parts = module.split(".")
    path = REPO.joinpath(*parts).with_suffix(".py")
    if not path.exists():
        path = REPO.joinpath(*parts, "__init__.py")
    return ast.get_docstring(ast.parse(path.read_text())) or ""


PUBLIC = [name for name in public_modules() if name not in NOT_REFERENCE]


def test_the_public_modules_are_found():
    assert {
        "cronjob",
        "cronjob.schedules",
        "cronjob.contrib.rq",
        "cronjob.contrib.django.schedules",
        "lease",
        "execctx",
    } <= set(PUBLIC)
    assert set(NOT_REFERENCE) <= set(public_modules())


@pytest.mark.parametrize("module", PUBLIC)
def test_every_public_module_has_a_page_in_the_nav(module):
    pages = documented_modules()
    assert module in pages, f"no page of docs/reference/api/ renders {module}"
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    assert f"reference/api/{pages[module]}" in str(nav)


WHOLE = sorted(set(rendered()) & set(PUBLIC))


@pytest.mark.parametrize("module", WHOLE)
def test_the_module_docstring_renders_as_written(module):
    """A module rendered whole shows its docstring at the top of its page."""
    text = docstring(module)
    assert text, f"{module} has no docstring"
    assert not re.search(r"(^|\s)::$", text, re.M), "a reST literal marker shows raw"
    assert not re.search(r":(meth|class|func|mod|attr|exc):`", text), "a Sphinx role shows raw"
    private = re.findall(r"`{1,2}(_[a-z]\w*)", text)
    assert not private, f"internal layout notes name private modules: {private}"
    assert not re.search(r"\bdocs/[\w/-]+\.md\b", text), "a path to a page: link it instead"


@pytest.mark.parametrize("module", WHOLE)
def test_the_page_does_not_repeat_the_module_summary(module):
    """The page's own words lead to the module's docstring, which mkdocstrings shows next."""
    page = (API / rendered()[module]).read_text()
    prose = " ".join(page.split(":::")[0].split("\n", 1)[1].split())
    summary = " ".join(docstring(module).split("\n\n")[0].split())
    for sentence in re.split(r"(?<=[.;:])\s+", prose):
        ratio = difflib.SequenceMatcher(None, sentence, summary).ratio()
        assert ratio < 0.75, f"the page says again {summary!r}"
