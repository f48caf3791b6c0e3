"""``cronjob status`` and ``cronjob history``: output, ``--json``, exit statuses, bad input.

The commands read "now" from the database's clock, so the replicas here run on a fake
clock set twenty seconds before the real time: what they leave on record is recent, and
they were seen (at their first sweep) within the last minute.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

import cronjob
import lease
from cronjob.admin._cli import main
from cronjob.testing import FakeClock


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def fail(ctx: cronjob.Round) -> None:
    raise RuntimeError("<script>alert('x')</script>\nupstream said 503")


@pytest.fixture
def ran(db_url: str) -> Iterator[str]:
    """Twenty seconds of two replicas, ending about now: 'tick' succeeds, 'flaky' fails.
    The replicas stay up through the test (one that stops leaves the live list)."""
    now = datetime.now(UTC).replace(microsecond=0)
    start = now - timedelta(seconds=now.second % 10 + 20)
    clock = FakeClock(start)
    registry = cronjob.Registry()
    registry.register(lambda ctx: None, "*/5 * * * * *", "tick")
    registry.register(fail, "*/10 * * * * *", "flaky")
    with (
        cronjob.Scheduler(db_url, registry=registry, clock=clock, replica_id="web-1"),
        cronjob.Scheduler(db_url, registry=registry, clock=clock, replica_id="web-2"),
    ):
        clock.advance(20)
        yield db_url


class TestStatus:
    def test_it_shows_the_jobs_and_the_replicas_and_exits_1_when_a_job_fails(self, ran, capsys):
        status, out, err = run(capsys, "status", "--database-url", ran)
        assert status == 1
        lines = out.splitlines()
        assert lines[0].split() == [
            "JOB", "SPEC", "NEXT", "(UTC)", "STATE", "LAST", "DURATION", "FAILURES", "MISSED",
        ]  # fmt: skip
        flaky, tick = lines[1], lines[2]
        assert (
            flaky.startswith("flaky ") and " failed " in flaky and flaky.split()[-2:] == ["2", "0"]
        )
        assert (
            tick.startswith("tick ") and " succeeded " in tick and tick.split()[-2:] == ["0", "0"]
        )
        assert "REPLICA" in lines[4] and lines[5].startswith("web-1 ")
        assert lines[6].startswith("web-2 ")
        assert err == "cronjob: job needs attention: flaky: failing: 2 rounds in a row failed\n"

    def test_a_healthy_job_alone_exits_0(self, ran, capsys):
        status, out, err = run(capsys, "status", "tick", "--database-url", ran)
        assert (status, err) == (0, "")
        assert "flaky" not in out

    def test_json_has_every_field(self, ran, capsys):
        status, out, _ = run(capsys, "status", "--json", "--database-url", ran)
        assert status == 1
        report = json.loads(out)
        assert report["healthy"] is False
        flaky = report["jobs"][0]
        assert flaky["name"] == "flaky" and flaky["spec"] == "*/10 * * * * *"
        assert flaky["last_outcome"] == "failed" and flaky["consecutive_failures"] == 2
        assert flaky["last_error"] == "RuntimeError: <script>alert('x')</script>\nupstream said 503"
        assert flaky["problems"] == ["failing: 2 rounds in a row failed"]
        assert [r["id"] for r in report["replicas"]] == ["web-1", "web-2"]
        datetime.fromisoformat(report["checked_at"])

    def test_a_paused_job_shows_paused_for_its_next_instant(self, ran, capsys):
        cronjob.admin.pause(ran, "tick", by="ops")
        status, out, _ = run(capsys, "status", "tick", "--database-url", ran)
        assert status == 0
        header, tick = out.splitlines()[:2]
        column = header.index("NEXT (UTC)")
        assert tick[column:].split()[:2] == ["paused", "paused"]  # NEXT, STATE
        pauses = out.splitlines()[3:5]  # who, since when: a table of their own
        assert pauses[0].split() == ["PAUSED", "BY", "SINCE", "(UTC)", "REASON"]
        assert pauses[1].split()[:2] == ["tick", "ops"] and pauses[1].endswith(" -")
        _, out, _ = run(capsys, "status", "--json", "--database-url", ran)
        flaky, tick_json = json.loads(out)["jobs"]
        assert (tick_json["next_instant"], tick_json["paused"]) == (None, True)
        assert (tick_json["spec"], tick_json["paused_by"]) == ("*/5 * * * * *", "ops")
        assert set(tick_json) == set(flaky)  # every other field kept
        assert flaky["paused"] is False
        datetime.fromisoformat(flaky["next_instant"])

    def test_a_paused_jobs_state_cell_is_one_word_and_who_and_why_go_below(self, ran, capsys):
        reason = "invoices API down since the 09:30 release, see OPS-412 " * 3
        _, out, _ = run(capsys, "status", "--database-url", ran)
        width = max(len(line) for line in out.splitlines()[:3])
        cronjob.admin.pause(ran, "tick", by="operator@bastion.example.com", reason=reason)
        _, out, _ = run(capsys, "status", "--database-url", ran)
        lines = out.splitlines()
        header, _, tick = lines[:3]
        state = header.index("STATE")
        assert tick[state : header.index("LAST")].rstrip() == "paused"
        # As wide as without the pause, give or take the one word (was 90 characters more).
        assert max(len(line) for line in lines[:3]) <= width + len("paused")
        assert lines[3] == ""
        assert lines[4].split() == ["PAUSED", "BY", "SINCE", "(UTC)", "REASON"]
        assert lines[5].startswith("tick    operator@bastion.example.com  20")
        assert lines[5].endswith("  invoices API down since the 09:30 rel...")  # 40 wide
        assert lines[6] == "" and lines[7].startswith("REPLICA")
        _, out, _ = run(capsys, "status", "--json", "--database-url", ran)
        tick_json = json.loads(out)["jobs"][1]
        assert tick_json["pause_reason"] == reason  # --json has it whole

    def test_an_unknown_job_is_one_line_and_exit_2(self, ran, capsys):
        assert run(capsys, "status", "nope", "--database-url", ran) == (
            2,
            "",
            "cronjob: error: no job named 'nope' is on record\n",
        )

    def test_the_database_url_comes_from_the_environment(self, ran, capsys, monkeypatch):
        monkeypatch.setenv("CRONJOB_DATABASE_URL", ran)
        assert run(capsys, "status", "tick")[0] == 0


class TestHistory:
    def test_it_lists_rounds_newest_first_with_errors_on_one_line(self, ran, capsys):
        status, out, err = run(capsys, "history", "flaky", "--database-url", ran)
        assert (status, err) == (0, "")
        header, *rows = out.splitlines()
        assert header.split()[:4] == ["INSTANT", "(UTC)", "ATTEMPT", "WHY"]
        assert len(rows) == 2
        assert rows[0] > rows[1] or rows[0][:19] > rows[1][:19]
        assert rows[0].endswith(
            "failed   RuntimeError: <script>alert('x')</script>\\nupstream said 503"
        )

    def test_limit_failed_since_and_json(self, ran, capsys):
        _, out, _ = run(capsys, "history", "tick", "--limit", "3", "--json", "--database-url", ran)
        rounds = json.loads(out)
        assert len(rounds) == 3 and rounds[0]["instant"] > rounds[1]["instant"]
        assert {r["outcome"] for r in rounds} == {"succeeded"}
        assert set(rounds[0]) >= {"job", "attempt", "replica", "why", "trace_id", "duration"}
        _, out, _ = run(capsys, "history", "tick", "--failed", "--json", "--database-url", ran)
        assert json.loads(out) == []
        _, out, _ = run(
            capsys, "history", "tick", "--since", "1d", "--limit", "100", "--json",
            "--database-url", ran,
        )  # fmt: skip
        assert len(json.loads(out)) == 4
        _, out, _ = run(
            capsys, "history", "tick", "--since", "2999-01-01", "--json", "--database-url", ran
        )
        assert json.loads(out) == []

    @pytest.mark.parametrize(
        ("argv", "message"),
        [
            (["--limit", "0"], "argument --limit: must be from 1 to 10000, got 0"),
            (["--since", "someday"], "argument --since: 'someday' is not a time: try "),
        ],
    )
    def test_bad_options_are_one_line_and_exit_2(self, ran, capsys, argv, message):
        status, out, err = run(capsys, "history", "tick", *argv, "--database-url", ran)
        assert (status, out) == (2, "")
        assert err.startswith(f"cronjob: error: {message}") and err.count("\n") == 1

    def test_an_unknown_job_is_one_line_and_exit_2(self, ran, capsys):
        assert run(capsys, "history", "nope", "--database-url", ran) == (
            2,
            "",
            "cronjob: error: no job named 'nope' is on record\n",
        )


class TestBadDatabase:
    @pytest.mark.blank_database
    def test_no_tables_is_one_line_exit_2_and_changes_nothing(self, db_url, capsys):
        for argv in (["status"], ["history", "tick"]):
            status, out, err = run(capsys, *argv, "--database-url", db_url)
            assert (status, out) == (2, "")
            assert err.startswith("cronjob: error: no cronjob tables") and err.count("\n") == 1
        if db_url.startswith("sqlite"):
            assert not Path(sa.make_url(db_url).database or "").exists()
        else:
            engine = lease.create_engine(db_url)
            assert sa.inspect(engine).get_table_names() == []
            engine.dispose()

    @pytest.mark.blank_database
    def test_an_older_schema_is_one_line_exit_2_and_changes_nothing(self, db_url, capsys):
        import alembic.command

        engine = lease.create_engine(db_url)
        with engine.connect() as conn:
            config = lease._migrate._config()
            config.attributes["connection"] = conn
            alembic.command.upgrade(config, "0001")
            conn.commit()
        status, out, err = run(capsys, "status", "--database-url", db_url)
        assert (status, out) == (2, "")
        assert err == (
            "cronjob: error: the cronjob tables are at revision 0001, older than 0018, which "
            "this release reads: start a replica of this release (it migrates at start) or "
            "run lease.migrate(); nothing was changed\n"
        )
        assert lease.current_revision(engine) == "0001"
        engine.dispose()

    def test_an_unreachable_database_is_one_line_and_exit_3(self, capsys):
        url = "postgresql+psycopg://nobody:secret@127.0.0.1:1/none"
        status, out, err = run(capsys, "status", "--database-url", url)
        assert (status, out) == (3, "")
        assert err.startswith("cronjob: error: the database could not be read: ")
        assert "secret" not in err and err.count("\n") == 1
