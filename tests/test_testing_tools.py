"""Tools for a user's tests: a round to call a job with, a registry derived from another."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

import cronjob
from cronjob.testing import make_round

NINE = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def digest(ctx: cronjob.Round) -> str:
    """A job as a user writes it: a fenced write, and a stop when cancelled."""
    if ctx.cancelled:
        ctx.check()
    with ctx.transaction() as conn:
        conn.execute(sa.text("INSERT INTO digests (sent_for) VALUES (:at)"), {"at": ctx.instant})
    return f"digest for {ctx.instant:%H:%M}"


class TestMakeRound:
    def test_a_job_can_be_called_with_a_round_and_writes_through_its_transaction(self, tmp_path):
        engine = sa.create_engine(f"sqlite:///{tmp_path / 'app.sqlite'}")
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE digests (sent_for TEXT)"))
        ctx = make_round("digest", NINE, engine=engine)
        assert (ctx.name, ctx.instant, ctx.attempt, ctx.cancelled) == ("digest", NINE, 1, False)
        assert digest(ctx) == "digest for 09:00"
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM digests")).scalar_one() == 1
        engine.dispose()

    def test_a_round_cancelled_up_front_shows_the_job_s_reaction(self):
        ctx = make_round("digest", NINE, cancelled=cronjob.Shutdown("draining"))
        with pytest.raises(cronjob.Shutdown, match=r"^draining$"):
            digest(ctx)
        assert ctx.wait(3600) is True  # at once: no real sleep

    def test_ctx_wait_runs_on_a_fake_clock(self):
        ctx = make_round("slow", NINE)
        done: list[bool] = []

        async def main() -> None:
            task = asyncio.create_task(asyncio.to_thread(lambda: done.append(ctx.wait(60))))
            await asyncio.sleep(0)
            clock = ctx._clock
            assert isinstance(clock, cronjob.testing.FakeClock)
            while not clock._timers:  # the wait has registered in fake time
                await asyncio.sleep(0.001)
            clock.advance(60)
            await task

        asyncio.run(main())
        assert done == [False]

    def test_a_transaction_without_an_engine_says_so(self):
        ctx = make_round("x", NINE)
        message = r"^make_round\('x'\) was given no \(sync\) engine$"
        with pytest.raises(RuntimeError, match=message), ctx.transaction():
            pass

    def test_a_naive_instant_is_refused(self):
        with pytest.raises(ValueError, match=r"^make_round needs an aware instant"):
            make_round("x", datetime(2026, 3, 2, 9, 0))


class TestDerive:
    def test_a_derived_registry_leaves_one_job_out_and_replaces_another(self):
        base = cronjob.Registry()
        base.register(digest, "0 0 9 * * *", "digest")
        base.register(digest, "0 0 * * * *", "hourly")
        base.register_per_instance(digest, "@every 60s", "local")
        seen: list[str] = []

        async def fake_hourly(ctx: cronjob.Round) -> None:
            seen.append(ctx.name)

        derived = base.derive(without=["digest"], replace={"hourly": fake_hourly})
        jobs = {job.name: job for job in derived.jobs}
        assert sorted(jobs) == ["hourly", "local"]
        assert jobs["hourly"].fn is fake_hourly and jobs["hourly"].is_async
        assert jobs["hourly"].schedule == base.jobs[1].schedule and jobs["hourly"].leased
        assert not jobs["local"].leased
        assert len(base) == 3  # the original is untouched

    def test_an_unknown_name_is_refused(self):
        base = cronjob.Registry()
        base.register(digest, "0 0 9 * * *", "digest")
        with pytest.raises(
            cronjob.RegistrationError, match=r"^cannot derive a registry: no job named 'nope'$"
        ):
            base.derive(without=["nope"])

    def test_the_default_registry_can_be_derived(self):
        derived = cronjob.default_registry.derive()
        assert isinstance(derived, cronjob.Registry)
        assert [j.name for j in derived.jobs] == [j.name for j in cronjob.default_registry.jobs]
