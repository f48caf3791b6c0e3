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
