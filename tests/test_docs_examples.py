"""Every Python example in README.md and on the documentation site's pages (docs/**/*.md)
runs, and prints what the page says it prints.

A ```python block is an example unless it is a sketch: a block with a line that is only
``...`` stands for code the reader fills in, and is not run. An example followed by a
```text block (the next python-or-text block of the page) must print exactly that text.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```(python|text)\n(.*?)^```", re.S | re.M)


def pages() -> list[Path]:
    """README.md, then every page of the site."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def examples(page: Path) -> list[tuple[str, str | None]]:
    """Each runnable python block of a page, with the text block right after it if any."""
    blocks = BLOCK.findall(page.read_text())
    found = []
    for i, (kind, body) in enumerate(blocks):
        sketch = any(line.strip() == "..." for line in body.splitlines())
        if kind != "python" or sketch:
            continue
        following = blocks[i + 1] if i + 1 < len(blocks) else None
        expected = following[1] if following and following[0] == "text" else None
        found.append((body, expected))
    return found


ALL = [
    pytest.param(code, expected, page, id=f"{page.relative_to(REPO)}#{n}")
    for page in pages()
    for n, (code, expected) in enumerate(examples(page), start=1)
]


@pytest.mark.parametrize(("code", "expected", "page"), ALL)
def test_the_example_runs_and_prints_what_the_page_says(
    code, expected, page, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    for _run in range(2):  # a reader runs it again: it must print the same again
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, str(page.relative_to(REPO)), "exec"), {"__name__": "example"})
        if expected is not None:
            assert out.getvalue() == expected


def test_the_pages_have_runnable_examples():
    """The rules are shown, not only told: most pages of the concepts carry examples."""
    counts = {page.relative_to(REPO).as_posix(): len(examples(page)) for page in pages()}
    assert counts["README.md"] >= 1
    assert sum(counts.values()) >= 20, counts
    for page in [
        "concepts/schedules.md",
        "concepts/lease.md",
        "concepts/rounds.md",
        "concepts/catch-up.md",
        "operations/status.md",
        "operations/pause.md",
        "operations/metrics.md",
        "testing/fake-clock.md",
        "integrations/fastapi.md",
    ]:
        assert counts[f"docs/{page}"] >= 1, page
    for page in ["apscheduler.md", "celery-beat.md", "kubernetes.md"]:
        assert counts[f"docs/coming-from/{page}"] >= 1, page


def test_a_sketch_is_told_apart_from_an_example(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nprint(1)\n```\n\n```text\n1\n```\n\n```python\ndef f():\n    ...\n```\n"
    )
    assert examples(page) == [("print(1)\n", "1\n")]
