"""``run_once`` itself, on every database: one engine per database whatever the URL's
driver, and the body's error raised even when forgetting its id fails too."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

import lease
from cronjob.contrib import _once, run_once


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, sa.Engine]]:
    """The process's engines by URL, empty for the test; disposed after."""
    cache: dict[str, sa.Engine] = {}
    monkeypatch.setattr(_once, "_engines", cache)
    yield cache
    for engine in cache.values():
        engine.dispose()


class TestEngines:
    def test_an_async_url_and_its_sync_url_share_one_engine_with_the_password(self, engines):
        """``str(url)`` would mask the password as ``***``: the engine could not log in."""
        first = _once._engine("postgresql+asyncpg://app:s3cret@db.invalid/app")
        again = _once._engine("postgresql+asyncpg://app:s3cret@db.invalid/app")
        sync = _once._engine("postgresql+psycopg://app:s3cret@db.invalid/app")
        assert first is again is sync
        assert first.url.password == "s3cret"
        assert list(engines) == ["postgresql+psycopg://app:s3cret@db.invalid/app"]

    def test_run_once_on_an_async_url_makes_one_engine_and_runs_the_body_once(
        self, migrated_engine, db_url, engines
    ):
        url = lease.async_url(db_url).render_as_string(hide_password=False)
        ran: list[str] = []
        for _ in range(3):
            run_once("occ-1", "t", lambda: ran.append("ran"), database=url)
        assert ran == ["ran"]
        [engine] = engines.values()
        assert not lease.is_async_url(engine.url)


class TestBodyFails:
    def test_the_body_s_error_is_raised_when_forgetting_its_id_fails_too(
        self, migrated_engine, caplog
    ):
        def body() -> None:
            # What makes the release fail, for real: its table is gone meanwhile.
            with migrated_engine.begin() as conn:
                conn.execute(sa.text("ALTER TABLE cronjob_once RENAME TO cronjob_once_away"))
            raise ValueError("the body failed")

        with (
            caplog.at_level(logging.WARNING, logger="cronjob"),
            pytest.raises(ValueError) as raised,
        ):
            run_once("occ-1", "t", body, database=migrated_engine)
        assert str(raised.value) == "the body failed"
        assert any("forgetting occurrence occ-1 failed" in n for n in raised.value.__notes__)
        assert "failed, and forgetting it failed too" in caplog.text
        with migrated_engine.begin() as conn:
            conn.execute(sa.text("ALTER TABLE cronjob_once_away RENAME TO cronjob_once"))
        # The row stays running: a redelivery within stale_after runs nothing.
        token, state = lease.begin_once(
            migrated_engine, "occ-1", task="t", holder="w", now_ms=0, stale_ms=10**12
        )
        assert (token, state) == (None, lease.ONCE_RUNNING)
