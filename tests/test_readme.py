"""README.md and the documentation pages (docs/): the README stays short and starts with
the two commands; every install line names this distribution; every link resolves; the
reference lists every scheduler argument. The pages' examples run in test_docs_examples.py.
"""

from __future__ import annotations

import inspect
import re
import tomllib
from pathlib import Path

import yaml

import cronjob

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").rglob("*.md"))

TWO_COMMANDS = """\
```sh
# Run the demo scheduler (examples/app.py) on the embedded SQLite default; Ctrl-C drains it.
python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/cronjob run examples.app

# Pass the tests: installs and starts what is missing (PostgreSQL, PgBouncer, MariaDB,
# Chromium, faketime), then runs the checks and the whole suite.
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
        assert re.fullmatch(rf"'?{re.escape(name)}(\[[\w-]+(,[\w-]+)*\])?'?", target), words
    for doc in [README, *DOCS]:  # nor an extra of a `cronjob` distribution, inline
        assert not re.search(r"\bcronjob\[", doc.read_text()), doc.name


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
    for command in ["run", "next", "status", "schedules", "history", "pause", "resume", "trigger"]:
        assert f"## `cronjob {command}`" in text, command
    for status in ["0", "1", "2", "3", "4", "5", "70"]:
        assert f"\n| {status} |" in text, status


#: Each capability and the page (and anchor) that tells it.
CAPABILITIES = {
    "Celery": "integrations/celery.md",
    "RQ": "integrations/rq.md",
    "Dramatiq": "task-queues/dramatiq.md",
    "cronjob beat": "integrations/celery.md#cronjob-beat-a-proj-a-beat_schedule-without-the-beat",
    "the outbox": "concepts/outbox.md",
    "backfill": "operations/backfill.md",
}


def test_each_capability_is_one_click_from_the_readme_and_the_home_page():
    readme = README.read_text()
    home = (REPO / "docs" / "index.md").read_text()
    for name, page in CAPABILITIES.items():
        assert f"](docs/{page})" in readme, name
        assert f"]({page})" in home, name


def test_the_task_queues_are_one_section_of_the_nav():
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    [queues] = [section["Task queues"] for section in nav if "Task queues" in section]
    pages = [page for entry in queues for page in entry.values()]
    others = str([section for section in nav if "Task queues" not in section])
    for page in ["integrations/celery.md", "integrations/rq.md", "task-queues/dramatiq.md"]:
        assert page in pages
        assert f"'{page}'" not in others
