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
import textwrap
from pathlib import Path

import pytest

from tests._process import run_python

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


def test_the_failure_hook_example_pages_three_times_then_the_job_pauses(tmp_path):
    """examples/on_failure.py, as its docstring says: a page per failed round (every 30 s),
    and after the third failure in a row ``import-prices`` pauses itself (a fake clock,
    in an interpreter of its own: the example registers on the default registry)."""
    code = textwrap.dedent(
        """
        import sys
        from datetime import UTC, datetime

        import cronjob
        import examples.on_failure
        from cronjob import admin
        from cronjob.testing import FakeClock

        clock = FakeClock(datetime(2026, 3, 2, 9, 0, 1, tzinfo=UTC))
        with cronjob.Scheduler(sys.argv[1], clock=clock):
            clock.advance(150)  # 09:00:30 … 09:02:30: five instants
        [job] = [job for job in admin.status(sys.argv[1]).jobs if job.name == "import-prices"]
        print("paused by", job.paused_by)
        """
    )
    done = run_python("-c", code, f"sqlite:///{tmp_path / 'pages.sqlite'}", cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    pages = [line for line in lines if line.startswith("PAGE: ")]
    assert [page.split(" at ")[1][:8] for page in pages] == ["09:00:30", "09:01:00", "09:01:30"]
    assert all(
        page.startswith("PAGE: cron job 'import-prices' failed at ")
        and page.endswith(f"ConnectionError: prices.example.com refused the connection (call {n})")
        for n, page in enumerate(pages, start=1)
    )
    assert lines[-1] == "paused by cronjob"
