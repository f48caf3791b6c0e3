"""The documentation site's hooks (docs/hooks.py): a raw Sphinx role on a page is a warning,
which ``mkdocs build --strict`` turns into a failed build."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PAGE = SimpleNamespace(file=SimpleNamespace(src_path="reference/api/cronjob.md"))


class TestRawRoles:
    @pytest.mark.parametrize(
        "html",
        [
            "<p>See :meth:<code>Registry.register</code>.</p>",
            "<p>Raises :class:<code>~lease.LeaseStore</code>.</p>",
            "<p>As :py:func:`status` does.</p>",
        ],
    )
    def test_it_warns_of_a_role_left_in_the_html(self, hooks, html, caplog):
        with caplog.at_level(logging.WARNING, logger="mkdocs"):
            assert hooks.on_page_content(html, page=PAGE, config={}, files=None) == html
        [record] = caplog.records
        assert record.levelno == logging.WARNING
        assert record.name.startswith("mkdocs.")  # counted by --strict
        assert record.getMessage().startswith(
            "reference/api/cronjob.md: a raw Sphinx role on the page: ':"
        )

    def test_it_names_the_role_as_written(self, hooks, caplog):
        with caplog.at_level(logging.WARNING, logger="mkdocs"):
            hooks.on_page_content(
                "<p>:meth:<code>Registry.register</code></p>", page=PAGE, config={}, files=None
            )
        assert "':meth:`Registry.register`'" in caplog.records[0].getMessage()

    @pytest.mark.parametrize(
        "html",
        [
            '<p>See <a href="cronjob.html#cronjob.Registry.register">Registry.register</a>.</p>',
            "<p>An in-memory database: <code>sqlite:///:memory:</code>.</p>",
            "<p>Keys: <code>class</code>, <code>meth</code>; a time 12:30:00.</p>",
        ],
    )
    def test_it_lets_a_page_without_roles_pass(self, hooks, html, caplog):
        with caplog.at_level(logging.WARNING, logger="mkdocs"):
            hooks.on_page_content(html, page=PAGE, config={}, files=None)
        assert caplog.records == []


class TestExamplePages:
    """Without ``repo_url``, a file under examples/ is a page of the site, and links go there."""

    def config(self, repo_url: str = "") -> dict[str, str]:
        return {"docs_dir": str(REPO / "docs"), "repo_url": repo_url}

    def test_a_link_to_an_example_goes_to_its_page(self, hooks):
        page = SimpleNamespace(file=SimpleNamespace(src_path="integrations/fastapi.md"))
        markdown = "as in [examples/fastapi_app.py](../../examples/fastapi_app.py)."
        assert hooks.on_page_markdown(markdown, page=page, config=self.config(), files=None) == (
            "as in [examples/fastapi_app.py](../examples/fastapi_app.py.md)."
        )

    def test_with_a_repo_url_the_link_goes_to_the_repository(self, hooks):
        page = SimpleNamespace(file=SimpleNamespace(src_path="integrations/fastapi.md"))
        markdown = "[app](../../examples/fastapi_app.py)"
        config = self.config("https://example.org/cronjob")
        assert hooks.on_page_markdown(markdown, page=page, config=config, files=None) == (
            "[app](https://example.org/cronjob/blob/main/examples/fastapi_app.py)"
        )

    def test_an_example_page_shows_the_file_in_a_code_block(self, hooks):
        text = hooks.example_page(REPO, REPO / "examples" / "fastapi_app.py")
        assert text.startswith("# `examples/fastapi_app.py`\n")
        assert "```python\n" + (REPO / "examples/fastapi_app.py").read_text() in text
