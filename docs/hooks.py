"""MkDocs hooks: links to repository files outside docs/, and no raw Sphinx roles.

The design documents link to the source files and tests they describe
(``[`_store.py`](../lease/_store.py)``). Those files are not pages of the site, so MkDocs
cannot serve them. This hook checks that each such target exists in the repository — a
link to a file that does not exist is a warning, which ``mkdocs build --strict`` turns
into a failure — and then renders the link as its text (or, when ``repo_url`` is set, as a
link to the file in the repository's browser).

Files under ``examples/`` are what readers copy, so without ``repo_url`` each one becomes a
page of the site of its own (``examples/fastapi_app.py.html``: its name, then its text in a
code block), not in the navigation, and a link to it goes there.

The API pages render docstrings with mkdocstrings, which knows no Sphinx roles: a
``:meth:`x``` in a docstring shows raw on the site. ``on_page_content`` warns for each one
left in a page's HTML, so ``--strict`` fails the build; docstrings cross-reference with
``[Registry.register][cronjob.Registry.register]`` or plain backticks instead.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files, InclusionLevel

log = logging.getLogger("mkdocs.hooks.cronjob")

# [text](target), not an image, outside a fenced block (the page's fences are skipped below).
LINK = re.compile(r"(?<!!)\[([^\]\n]*)\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
# A Sphinx role as Markdown renders it: the role, then its target in a code span.
ROLE = re.compile(
    r":(?:py:)?(?:meth|func|class|attr|exc|mod|data|obj|const|type|any|ref|doc):"
    r"(?:`|<code>)([^`<]*)"
)


#: The repository's folder whose files get pages of their own (without ``repo_url``).
EXAMPLES = "examples"
#: Where those pages go on the site, and the language of their code block by suffix.
LANGUAGES = {".py": "python", ".toml": "toml", ".md": "markdown", ".txt": "text"}


def example_files(repo: Path) -> list[Path]:
    """The files under examples/ that get a page: text files of the languages above."""
    return sorted(
        path
        for path in (repo / EXAMPLES).rglob("*")
        if path.is_file() and path.suffix in LANGUAGES and "__pycache__" not in path.parts
    )


def example_page(repo: Path, path: Path) -> str:
    """The Markdown of ``path``'s page: its name, then its text as a code block."""
    relative = path.relative_to(repo).as_posix()
    text = path.read_text()
    fence = "`" * max([3, *(len(run) + 1 for run in re.findall(r"`{3,}", text))])
    return (
        f"# `{relative}`\n\n"
        f"The file as it is in the repository.\n\n"
        f"{fence}{LANGUAGES[path.suffix]}\n{text.rstrip()}\n{fence}\n"
    )


def on_files(files: Files, config: Any) -> Files:
    if config.get("repo_url"):
        return files
    repo = Path(config["docs_dir"]).resolve().parent
    for path in example_files(repo):
        files.append(
            File.generated(
                config,
                path.relative_to(repo).as_posix() + ".md",
                content=example_page(repo, path),
                inclusion=InclusionLevel.NOT_IN_NAV,
            )
        )
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs = Path(config["docs_dir"]).resolve()
    repo = docs.parent
    here = (docs / page.file.src_path).parent
    repo_url = (config.get("repo_url") or "").rstrip("/")

    def swap(match: re.Match[str]) -> str:
        text, target = match.groups()
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", target):  # a URL, an anchor, absolute
            return match.group(0)
        path = (here / target.split("#")[0]).resolve()
        if path.is_relative_to(docs):  # a page or file of the site: MkDocs checks it
            return match.group(0)
        if not path.is_relative_to(repo) or not path.exists():
            log.warning(
                "%s: link to '%s': no such file in the repository", page.file.src_path, target
            )
            return match.group(0)
        relative = path.relative_to(repo).as_posix()
        if repo_url:
            return f"[{text}]({repo_url}/blob/main/{relative})"
        if path in example_files(repo):  # a page of the site (on_files)
            return f"[{text}]({os.path.relpath(docs / (relative + '.md'), here)})"
        return text or f"`{relative}`"

    parts: list[str] = []
    last = 0
    for fence in FENCE.finditer(markdown):
        parts.append(LINK.sub(swap, markdown[last : fence.start()]))
        parts.append(fence.group(0))
        last = fence.end()
    parts.append(LINK.sub(swap, markdown[last:]))
    return "".join(parts)


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    for match in ROLE.finditer(html):
        log.warning(
            "%s: a raw Sphinx role on the page: '%s' (write [name][package.name] or "
            "`name` in the docstring)",
            page.file.src_path,
            re.sub(r"</?code>", "`", match.group(0)) + "`",
        )
    return html
