"""README.md and the documentation pages (docs/): the README stays short and starts with
the two commands; every install line names this distribution; every link resolves; the
reference lists every scheduler argument. The pages' examples run in test_docs_examples.py.
"""

from __future__ import annotations

import inspect
import re
import tomllib
from pathlib import Path

import cronjob

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").rglob("*.md"))

TWO_COMMANDS = """\
```sh
# Run the demo scheduler (examples/app.py) on the embedded SQLite default; Ctrl-C drains it.
python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/cronjob run examples.app

# Pass the tests: installs and starts what is missing (PostgreSQL, MariaDB, Chromium,
# faketime), then runs the checks and the whole suite.
bash scripts/test
```
"""


def test_the_readme_is_short_and_its_first_block_is_the_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    first = text.index("```")
    assert text[first : first + len(TWO_COMMANDS)] == TWO_COMMANDS


def test_every_install_line_installs_this_distribution():
    """`pip install cronjob` fetches an unrelated project: every line names ours."""
    name = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["name"]
    assert name == "cronjob-lease"
    lines = [
        line.split("#")[0].split()
        for doc in [README, *DOCS]
        for line in doc.read_text().splitlines()
        if line.startswith("pip install ")
    ]
    assert len(lines) >= 4
    for words in lines:
        (target,) = words[2:]
        assert re.fullmatch(rf"'?{re.escape(name)}(\[[\w-]+\])?'?", target), words
    for doc in [README, *DOCS]:  # nor an extra of a `cronjob` distribution, inline
        assert not re.search(r"\bcronjob\[", doc.read_text()), doc.name


def test_the_docs_cite_only_files_in_the_repository():
    for doc in [README, *DOCS]:
        text = doc.read_text()
        assert "SPEC.md" not in text, doc.name
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://", "#")):
                continue
            path = (doc.parent / target.split("#")[0]).resolve()
            assert path.is_relative_to(REPO) and path.exists(), (doc.name, target)


def test_the_configuration_reference_lists_every_scheduler_argument():
    text = (REPO / "docs" / "reference" / "configuration.md").read_text()
    for name in inspect.signature(cronjob.Scheduler).parameters:
        assert f"| `{name}` |" in text, name


def test_the_cli_reference_documents_every_command_and_exit_status():
    text = (REPO / "docs" / "reference" / "cli.md").read_text()
    for command in ["run", "next", "status", "history", "pause", "resume", "trigger"]:
        assert f"## `cronjob {command}`" in text, command
    for status in ["0", "1", "2", "3", "4", "70"]:
        assert f"\n| {status} |" in text, status
