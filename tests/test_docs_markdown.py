"""The Markdown of README.md and the site's pages is well formed where the build cannot tell.

A code fence lost or doubled in an edit does not fail ``mkdocs build --strict``: the page
renders code as prose and prose as code, and tests/test_docs_examples.py, which cuts the
blocks out with a regular expression, may still find and run them. Two checks catch it:

- every fenced block opens with a language and closes before the page ends (the pages
  always name the language, so a bare opening fence is a closing fence whose opening was
  lost), and no fence line sits inside a block, where it would show as text;
- every example that test runs, and the output it compares, is a code block of the page as
  the site renders it (the Markdown extensions of mkdocs.yml).
"""

from __future__ import annotations

import html
import re
from functools import cache
from pathlib import Path
from typing import Any

import markdown
import pytest
import yaml

from tests.test_docs_examples import REPO, examples, pages

FENCE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


def fence_problems(text: str) -> list[str]:
    """What is wrong with the fenced code blocks of a Markdown text, one line each."""
    problems = []
    opened: tuple[int, str] | None = None  # the line number and the fence of the open block
    for n, line in enumerate(text.splitlines(), start=1):
        found = FENCE.match(line)
        if not found:
            continue
        fence, info = found["fence"], found["info"].strip()
        if opened is None:
            if not info:
                problems.append(f"line {n}: a code block opens with no language")
            opened = (n, fence)
        elif fence[0] == opened[1][0] and len(fence) >= len(opened[1]):
            if info:
                problems.append(
                    f"line {n}: {line.strip()!r} inside the code block opened at line "
                    f"{opened[0]} shows as text"
                )
            else:
                opened = None
    if opened is not None:
        problems.append(f"line {opened[0]}: the code block opened here never closes")
    return problems


@cache
def _extensions() -> tuple[list[str], dict[str, dict[str, Any]]]:
    """The Markdown extensions the site is built with, as mkdocs.yml names them."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    names, options = [], {}
    for entry in config["markdown_extensions"]:
        name, settings = next(iter(entry.items())) if isinstance(entry, dict) else (entry, {})
        names.append(name)
        options[name] = settings or {}
    return names, options


def rendered_code(text: str) -> list[str]:
    """The text of each code block of a Markdown page, as the site renders it."""
    names, options = _extensions()
    page = markdown.markdown(text, extensions=names, extension_configs=options)
    blocks = re.findall(r"<pre[^>]*>(.*?)</pre>", page, re.S)
    return [html.unescape(re.sub(r"<[^>]+>", "", block)).strip("\n") for block in blocks]


def examples_not_shown_as_code(text: str, page: Path) -> list[str]:
    """The examples (and their outputs) the docs tests take from a page but it does not
    render as code blocks."""
    shown = set(rendered_code(text))
    missing = []
    for n, (code, expected) in enumerate(examples(page), start=1):
        for kind, body in [("example", code), ("its output", expected)]:
            if body is not None and body.strip("\n") not in shown:
                missing.append(f"example {n}: {kind} is not a code block of the page")
    return missing


PAGES = [pytest.param(page, id=page.relative_to(REPO).as_posix()) for page in pages()]


@pytest.mark.parametrize("page", PAGES)
def test_every_code_block_opens_with_a_language_and_closes(page):
    assert fence_problems(page.read_text()) == []


@pytest.mark.parametrize("page", PAGES)
def test_every_example_the_tests_run_is_shown_as_code(page):
    assert examples_not_shown_as_code(page.read_text(), page) == []


SPLICED = """\
```python
print("buffer_one")
```

```text
buffer_one
```

What buffer_one does. `on_success` on the fake clock:

def told(record):
    print("told")
```

```python
print("told")
```

```text
told
```
"""


class TestTheChecksCatchALostFence:
    """A page whose example lost its opening fence in an edit (the policies page did)."""

    def test_the_fences_are_found_unbalanced(self):
        assert fence_problems(SPLICED) == [
            "line 13: a code block opens with no language",
            "line 15: '```python' inside the code block opened at line 13 shows as text",
        ]

    def test_the_example_the_tests_run_is_not_shown_as_code(self, tmp_path):
        page = tmp_path / "page.md"
        page.write_text(SPLICED)
        assert examples_not_shown_as_code(SPLICED, page) == [
            "example 2: example is not a code block of the page",
        ]

    def test_a_block_left_open_at_the_end_is_found(self):
        assert fence_problems("Text.\n\n13:00\n```\n\nMore text.\n") == [
            "line 4: a code block opens with no language",
            "line 4: the code block opened here never closes",
        ]

    def test_a_well_formed_page_passes(self, tmp_path):
        text = "```python\nprint(1)\n```\n\n```text\n1\n```\n"
        page = tmp_path / "page.md"
        page.write_text(text)
        assert fence_problems(text) == []
        assert examples_not_shown_as_code(text, page) == []

    def test_a_fence_shown_inside_a_longer_fence_is_text(self):
        assert fence_problems("````markdown\n```python\nprint(1)\n```\n````\n") == []
