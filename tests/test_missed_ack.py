"""Missed instants a policy chose not to run are on record as skipped, not alarmed; the
others an operator acknowledges (``cronjob missed NAME --ack``, `admin.acknowledge`), on
record with who and why, and they stop counting toward ``status``'s exit status.

Two replicas on one fake clock and one database (each of the three in turn).
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from datetime import datetime

import pytest

from cronjob import Registry, Scheduler, admin
from cronjob.admin import _page, _read_cli
from cronjob.admin._cli import main
from tests.test_missed import MINUTELY, Job, at, report, two

HOURLY = "0 0 * * * *"


def stop(schedulers: list[Scheduler]) -> None:
    for scheduler in schedulers:
        scheduler.stop()


def notes(url: str, name: str = "report") -> list[tuple[datetime, datetime, str, str]]:
    """The job's skipped-instant notes: (first, last, policy, replica)."""
    return [
        (r.started, r.instant, str(r.outcome), r.replica)
        for r in admin.history(url, name, limit=50)
        if r.why == admin.Why.SKIPPED
    ]


class TestSkippedByPolicy:
    def test_catch_up_none_records_the_instants_it_skipped_and_status_is_healthy(
        self, db_url, replicas, clock
    ):
        """Every replica stopped from 09:03:30 to 09:06:30: while they are down the
        instants are missed (nothing decided on them); once one is back, its catch-up
        (none) skips them on purpose, on record, and status is healthy again."""
        registry = Registry()
        job = Job()
        registry.register(job, MINUTELY, "report", catch_up="none")
        started = two(replicas, registry)
        clock.advance(3 * 60 + 30)
        stop(started)
        clock.advance(3 * 60)  # 09:06:30: 09:04, 09:05 past the grace
        assert report(db_url, clock).missed == 2
        two(replicas, registry)
        clock.advance(60)  # 09:07:30: 09:07 ran
        assert at(6) not in job.instants and at(7) in job.instants  # none: not run
        found = report(db_url, clock)
        assert (found.missed, found.skipped, found.problems) == (0, 3, ())
        assert admin.status(db_url, now=clock.now()).healthy
        [(first, last, policy, _)] = notes(db_url)
        assert (first, last, policy) == (at(4), at(6), "catch_up=none")

    def test_catch_up_latest_records_the_older_instants_it_passed_over_once(
        self, db_url, replicas, clock
    ):
        registry = Registry()
        registry.register(Job(), MINUTELY, "report")
        started = two(replicas, registry)
        clock.advance(5 * 60 + 30)
        stop(started)
        clock.advance(5 * 60)  # 09:10:30
        two(replicas, registry)  # both catch up together: one note
        clock.advance(15)
        assert notes(db_url)[0][:3] == (at(6), at(9), "catch_up=latest")
        assert len(notes(db_url)) == 1
        found = report(db_url, clock)
        assert (found.missed, found.skipped) == (0, 4)

    def test_an_instant_past_the_catch_up_window_is_recorded_as_skipped_by_it(
        self, db_url, replicas, clock
    ):
        """Hourly, a 10-minute window: back at 10:30, 10:00 is too old to run."""
        registry = Registry()
        job = Job()
        registry.register(job, HOURLY, "report", catch_up_window=600)
        started = two(replicas, registry)
        clock.advance(30 * 60)
        stop(started)
        clock.advance(60 * 60)  # 10:30
        assert report(db_url, clock).missed == 1
        two(replicas, registry)
        clock.advance(15)
        [(first, last, policy, _)] = notes(db_url)
        assert (first, last, policy) == (at(60), at(60), "catch_up_window")
        assert job.instants == []
        found = report(db_url, clock)
        assert (found.missed, found.skipped) == (0, 1)


class TestAcknowledge:
    def down(
        self, replicas: Callable[..., Scheduler], registry: Registry, clock
    ) -> list[Scheduler]:
        """Every replica down from 09:01:30 to 09:11:30: 09:02 to 09:10 missed."""
        registry.register(Job(), MINUTELY, "report")
        started = two(replicas, registry)
        clock.advance(60 + 30)
        stop(started)
        clock.advance(10 * 60)
        return started

    def test_the_command_acknowledges_them_with_who_and_why_and_they_stop_counting(
        self, db_url, replicas, clock, capsys
    ):
        """The command reads the database's clock: the counts are read at the fake
        clock's time through the admin API, as the page and `status --json` show them."""
        self.down(replicas, Registry(), clock)
        assert main(["missed", "report", "--database-url", db_url]) == 1
        assert re.match(
            r"^report: \d+ missed, 0 skipped by its catch-up policy, 0 acknowledged \(last day\)$",
            capsys.readouterr().out,
        )
        code = main(
            ["missed", "report", "--ack", "--by", "ops", "--reason", "planned stop",
             "--until", at(11).isoformat(), "--database-url", db_url]
        )  # fmt: skip
        out = capsys.readouterr().out
        assert code == 0
        assert out == (
            "acknowledged the missed instants of report up to 2026-03-02 09:11:00 UTC, "
            "by ops (planned stop)\n"
        )
        found = report(db_url, clock)
        assert (found.missed, found.missed_acknowledged) == (0, 9)
        assert [p for p in found.problems if p.startswith("missed")] == []  # (stale: all down)
        ack = found.acknowledgement
        assert ack is not None and (ack.through, ack.by, ack.reason) == (
            at(11),
            "ops",
            "planned stop",
        )
        status = admin.status(db_url, now=clock.now())
        table = io.StringIO()
        _read_cli._print_status(status, table)
        lines = table.getvalue().splitlines()
        assert lines[0].split()[-1] == "MISSED" and lines[1].split()[-1] == "0"
        assert lines[3].split() == [
            "ACKNOWLEDGED",
            "INSTANTS",
            "UP",
            "TO",
            "(UTC)",
            "BY",
            "AT",
            "REASON",
        ]
        assert lines[4].split()[:5] == ["report", "9", "2026-03-02", "09:11:00", "ops"]
        assert lines[4].endswith("planned stop")
        [job] = json.loads(json.dumps(_read_cli._jsonable(status)))["jobs"]
        assert (job["missed"], job["missed_acknowledged"]) == (0, 9)
        assert job["acknowledgement"]["by"] == "ops"
        page = _page.job_page(found, [], "", failed=False, checked_at=clock.now())
        assert "9 of the last day; acknowledged up to 2026-03-02 09:11:00 UTC by ops" in page
        assert re.search(r'data-label="Missed"[^>]*>0 \(\+9 acked\)<', _page.jobs_page(status, ""))
        [note] = [r for r in admin.history(db_url, "report") if r.why == admin.Why.ACK]
        assert (note.replica, note.instant, note.outcome) == ("ops", at(11), "acknowledged")

    def test_instants_after_the_acknowledgement_raise_the_alarm_again(
        self, db_url, replicas, clock
    ):
        self.down(replicas, Registry(), clock)
        done = admin.acknowledge(db_url, "report", until=at(5), by="ops", now=clock.now())
        assert done.through == at(5)
        found = report(db_url, clock)
        assert (found.missed, found.missed_acknowledged) == (5, 4)  # 09:06 to 09:10 not
        admin.acknowledge(db_url, "report", by="ops", now=clock.now())  # up to now
        assert report(db_url, clock).missed == 0
        clock.advance(3 * 60)
        found = report(db_url, clock)
        assert (found.missed, found.missed_acknowledged) == (2, 10)  # 09:12, 09:13
        assert not admin.status(db_url, now=clock.now()).healthy

    @pytest.mark.blank_database
    def test_it_refuses_an_unknown_job_and_options_without_ack(self, db_url, capsys):
        with pytest.raises(admin.TablesMissing):
            admin.acknowledge(db_url, "nosuch")
        assert main(["missed", "report", "--reason", "x", "--database-url", db_url]) == 2
        assert capsys.readouterr().err == (
            "cronjob missed: --until, --reason and --by go with --ack\n"
        )

    def test_an_unknown_job_or_a_naive_until_is_refused(self, db_url, replicas, clock):
        self.down(replicas, Registry(), clock)
        with pytest.raises(admin.UnknownJob, match=r"^no job named 'nosuch' is on record$"):
            admin.acknowledge(db_url, "nosuch", now=clock.now())
        with pytest.raises(ValueError, match="until"):
            admin.acknowledge(db_url, "report", until=datetime(2026, 3, 2, 9, 5))
        assert report(db_url, clock).acknowledgement is None
