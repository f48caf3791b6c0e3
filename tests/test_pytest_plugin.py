"""The pytest plugin, through pytest itself (``pytester``): loaded by its entry point,
its fixtures run a user's suite as a user would write it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import sqlalchemy as sa

PAGE = Path(__file__).resolve().parents[1] / "docs" / "testing" / "pytest.md"


def readme_test() -> str:
    """The docs' example of a user's test (the python block that defines it)."""
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    (block,) = [b for b in blocks if "def test_digest_runs_daily_at_nine_paris_time" in b]
    return block


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    # A process of its own: the user's job modules register on the default registry.
    return pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", *args)


def test_the_readmes_user_test_passes_and_fits_in_20_lines(pytester):
    code = readme_test()
    assert len(code.splitlines()) < 20
    pytester.makepyfile(test_digest=code)
    run(pytester).assert_outcomes(passed=1)


def test_the_readmes_user_test_fails_when_the_rounds_differ(pytester):
    pytester.makepyfile(test_digest=readme_test().replace('"30 07:00Z succeeded",', ""))
    result = run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*Left contains one more item: '30 07:00Z succeeded'*"])


JOBS = """
import cronjob

@cronjob.job("0 0 * * * *", name="hourly")
def hourly(ctx):
    pass

@cronjob.job("0 30 * * * *", name="broken")
def broken(ctx):
    raise RuntimeError("boom")

@cronjob.job_per_instance("0 0 * * * *", name="local")
def local(ctx):
    pass
"""

USER_TESTS = """
import cronjob
from cronjob.testing import RanRound
from datetime import datetime, timezone
import jobs  # registers on the default registry

schedulers = []

def test_default_registry_on_two_replicas(cronjob_replicas, cronjob_clock, cronjob_rounds):
    assert cronjob_clock.now() == datetime(2026, 1, 5, tzinfo=timezone.utc)
    schedulers.extend(cronjob_replicas(2))
    assert [s.replica_id for s in schedulers] == ["replica-1", "replica-2"]
    cronjob_clock.advance(3600)
    leased = sorted(
        (r.job, r.instant.strftime("%H:%M"), r.attempt, r.outcome.value)
        for r in cronjob_rounds if r.job != "local"
    )
    assert leased == [("broken", "00:30", 1, "failed"), ("hourly", "01:00", 1, "succeeded")]
    local = [r.replica for r in cronjob_rounds if r.job == "local"]
    assert sorted(local) == ["replica-1", "replica-2"]  # per-instance: on every replica
    assert all(isinstance(r, RanRound) for r in cronjob_rounds)

def test_the_replicas_were_stopped_after_the_test():
    assert len(schedulers) == 2
    assert not any(s.ready for s in schedulers)

def test_each_test_starts_from_its_own_clock(cronjob_replicas, cronjob_clock, cronjob_rounds):
    cronjob_replicas(1)
    cronjob_clock.advance(3600)
    assert [(r.job, r.instant.hour) for r in cronjob_rounds if r.job == "hourly"] == [("hourly", 1)]
"""


def test_the_fixtures_run_the_default_registry_and_record_each_round(pytester):
    pytester.makepyfile(jobs=JOBS, test_user=USER_TESTS)
    run(pytester).assert_outcomes(passed=3)


@pytest.mark.postgres
def test_on_the_database_given_each_test_starts_afresh(pytester, postgres_url):
    pytester.makepyfile(jobs=JOBS, test_user=USER_TESTS)
    run(pytester, f"--cronjob-database-url={postgres_url}").assert_outcomes(passed=3)
    engine = sa.create_engine(postgres_url)
    with engine.connect() as conn:
        # The jobs' rows; a name with a leading space is the history's turn to prune.
        names = conn.execute(
            sa.text("SELECT name FROM cronjob_lease WHERE name NOT LIKE ' %' ORDER BY name")
        ).scalars()
        assert list(names) == ["broken", "hourly"]
    engine.dispose()


def test_the_plugin_is_registered_by_its_entry_point(pytester):
    result = pytester.runpytest_subprocess("--help")
    result.stdout.fnmatch_lines(["*--cronjob-database-url=URL*"])
