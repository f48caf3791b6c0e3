"""Every Python example in README.md runs, and prints what the README says it prints."""

from __future__ import annotations

import contextlib
import io
import re
import tomllib
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"```(python|text)\n(.*?)```", re.S)


def examples() -> list[tuple[str, str | None]]:
    """Each python block, with the text block right after it when there is one."""
    blocks = BLOCK.findall(README.read_text())
    found = []
    for i, (kind, body) in enumerate(blocks):
        sketch = any(line.strip() == "..." for line in body.splitlines())
        if kind != "python" or sketch:  # a sketch, not a program
            continue
        following = blocks[i + 1] if i + 1 < len(blocks) else None
        expected = following[1] if following and following[0] == "text" else None
        found.append((body, expected))
    return found


@pytest.mark.parametrize(("code", "expected"), examples(), ids=lambda v: str(v)[:40])
def test_the_readme_example_runs(code, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for _run in range(2):  # a reader runs it again: it must print the same again
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
        if expected is not None:
            assert out.getvalue() == expected


def test_the_readme_has_runnable_examples():
    assert len(examples()) >= 6


def test_every_install_line_installs_this_distribution():
    """`pip install cronjob` fetches an unrelated project: every line names ours."""
    repo = README.parent
    name = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["name"]
    assert name == "cronjob-lease"
    lines = [
        line.split("#")[0].split()
        for doc in [README, *sorted((repo / "docs").glob("*.md"))]
        for line in doc.read_text().splitlines()
        if line.startswith("pip install ")
    ]
    assert len(lines) == 3
    for words in lines:
        (target,) = words[2:]
        assert re.fullmatch(rf"'?{re.escape(name)}(\[\w+\])?'?", target), words


#: An install of the other project, anywhere on a line: ``pip install cronjob`` not
#: followed by ``-lease`` (quoted or not, with extras or not), or an extra of the name
#: ``cronjob`` in any words (``install cronjob[sqlite-async]`` in an error message).
OTHER_DISTRIBUTION = re.compile(
    r"pip3? install +['\"]?cronjob(?![\w-])|(?<![\w./-])cronjob\[[a-z][\w,-]*\]"
)


def install_texts(repo: Path) -> list[Path]:
    """What a user reads to install: README, every page under docs/ (a docs site
    included), the examples and the packages' sources (their error messages)."""
    files = [README, *sorted((repo / "docs").rglob("*.md"))]
    for package in ("cronjob", "lease", "execctx", "examples", "alembic"):
        files += sorted((repo / package).rglob("*.py"))
    return files


def test_no_text_installs_the_other_distribution(tmp_path):
    repo = README.parent
    texts = install_texts(repo)
    assert README in texts and len(texts) > 20
    found = [
        f"{path.relative_to(repo)}:{number}: {line.strip()}"
        for path in texts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if OTHER_DISTRIBUTION.search(line)
    ]
    assert found == []
    # The pattern catches each way of naming the other project, and none of ours.
    for wrong in (
        "pip install 'cronjob[postgres-async]'",
        'then pip install "cronjob[mysql-async]"',
        "run pip install cronjob[sqlite-async]",
        "  $ pip install cronjob",
        "pip install cronjob==1.0",
        "an async driver: install cronjob[sqlite-async] (aiosqlite)",
        "`'cronjob[mysql-async]'` (PyMySQL and aiomysql)",
    ):
        assert OTHER_DISTRIBUTION.search(wrong), wrong
    for right in (
        "pip install 'cronjob-lease[postgres-async]'",
        "pip install cronjob-lease",
        "install cronjob-lease[sqlite-async] (aiosqlite)",
        "pip install ./cronjob",
        "entries[cronjob[0]]",
    ):
        assert not OTHER_DISTRIBUTION.search(right), right
    # A page of a docs site, nested under docs/, is read too.
    (tmp_path / "docs" / "site" / "guide").mkdir(parents=True)
    (tmp_path / "docs" / "site" / "guide" / "install.md").write_text("pip install cronjob\n")
    assert tmp_path / "docs" / "site" / "guide" / "install.md" in install_texts(tmp_path)


def test_the_docs_cite_only_files_in_the_repository():
    repo = README.parent
    for doc in [README, *sorted((repo / "docs").glob("*.md"))]:
        text = doc.read_text()
        assert "SPEC.md" not in text, doc.name
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://", "#")):
                continue
            path = (doc.parent / target.split("#")[0]).resolve()
            assert path.is_relative_to(repo) and path.exists(), (doc.name, target)


def test_the_readme_lists_every_scheduler_argument():
    import inspect

    import cronjob

    text = README.read_text()
    for name in inspect.signature(cronjob.Scheduler).parameters:
        assert f"| `{name}` |" in text, name
