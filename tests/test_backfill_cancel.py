"""A backfill stopped: cancelled by an operator (``cronjob backfill NAME --cancel``,
`cronjob.admin.cancel_backfill`) after the round in flight, on record and shown; and
left by a drain or a stop of the replica running it, the rest of its range resumed by
another replica or the next start, however long that takes.

Two replicas on one fake clock and one database (each of the three in turn). Nothing
sleeps in real time.
"""

from __future__ import annotations

import json
from datetime import datetime

from test_backfill import Job, at, history

import lease
from cronjob import Registry, Trigger, admin
from cronjob.admin._cli import main
from lease._history import _BACKFILL_MARK, _BACKFILL_OPEN
from lease._trigger import BACKFILL_MARK

HOURLY = "0 0 * * * *"


def registry_of(job: Job) -> Registry:
    registry = Registry()
    registry.register(job, HOURLY, "report")
    return registry


def backfilled(job: Job) -> list[tuple[datetime, str]]:
    """(instant, replica) of each backfill round begun, in order."""
    return [(s.instant, s.replica) for s in job.seen if s.trigger is Trigger.BACKFILL]


def succeeded(url: str) -> list[datetime]:
    """The instants whose backfill round succeeded, oldest first."""
    return [i for i, why, out in history(url) if why == "backfill" and out == "succeeded"]


def hours(*offsets: int) -> list[datetime]:
    return [at(h) for h in offsets]


class TestLeftByItsReplica:
    def test_a_drain_of_the_replica_running_it_leaves_the_rest_to_the_other(
        self, db_url, replicas, clock
    ):
        job = Job(clock, seconds=30)
        registry = registry_of(job)
        a = replicas(registry, "a")
        clock.advance(3600 + 45)  # 10:00 ran until 10:00:30, on a alone
        admin.backfill(db_url, "report", start=at(-4), end=at(0), now=clock.now())
        clock.advance(15)  # a's sweep took 06:00
        assert backfilled(job) == [(at(-4), "a")]
        replicas(registry, "b")
        a.stop()  # the drain cuts 06:00 short; 07:00 to 09:00 still queued
        clock.advance(300)
        assert backfilled(job) == [
            (at(-4), "a"),
            (at(-4), "b"),  # its second run
            (at(-3), "b"),
            (at(-2), "b"),
            (at(-1), "b"),
        ]
        assert succeeded(db_url) == hours(-4, -3, -2, -1)
        assert not job.overlapped

    def test_with_every_replica_stopped_for_days_the_next_start_resumes_it(
        self, db_url, replicas, clock
    ):
        """Three days down, and a prune keeping one day of history meanwhile: the
        instants not yet run stay queued (a request for a round now would have expired
        and been pruned), and the next replica to start runs them."""
        job = Job(clock, seconds=30)
        registry = registry_of(job)
        started = [replicas(registry, "a"), replicas(registry, "b")]
        clock.advance(3600 + 45)
        admin.backfill(db_url, "report", start=at(-4), end=at(0), now=clock.now())
        clock.advance(15)
        [(first, _runner)] = backfilled(job)
        for scheduler in started:
            scheduler.stop()
        clock.advance(3 * 86400)
        engine = lease.create_engine(db_url)
        try:
            lease.LeaseStore(engine, clock=clock.now).prune(
                days=1, per_name=100, replicas_gone=86400
            )
        finally:
            engine.dispose()
        [report] = admin.status(db_url, now=clock.now()).jobs
        # 06:00 cut short by the drain (its second run owed), 07:00 to 09:00 queued.
        assert (report.backfill_queued, report.backfilling) == (3, first)
        replicas(registry, "c")
        clock.advance(600)
        assert succeeded(db_url) == hours(-4, -3, -2, -1)

    def test_the_prune_knows_a_backfills_open_states(self):
        assert _BACKFILL_MARK == BACKFILL_MARK
        assert set(_BACKFILL_OPEN) == {
            lease.TriggerState.QUEUED.value,
            lease.TriggerState.RUNNING.value,
            lease.TriggerState.CUT.value,
        }


class TestCancel:
    def test_it_stops_after_the_round_in_flight_on_record_and_shown(self, db_url, replicas, clock):
        job = Job(clock, seconds=30)
        registry = registry_of(job)
        replicas(registry, "a")
        replicas(registry, "b")
        clock.advance(3600 + 45)
        asked = admin.backfill(db_url, "report", start=at(-4), end=at(0), now=clock.now())
        clock.advance(15)  # 06:00 runs (30 s)
        [(first, _runner)] = backfilled(job)
        done = admin.cancel_backfill(db_url, "report", by="ops@laptop", now=clock.now())
        assert done.cancelled == tuple(hours(-3, -2, -1))
        assert (done.running, done.by, done.at) == (first, "ops@laptop", clock.now())
        clock.advance(600)
        assert backfilled(job) == [(first, _runner)]  # the round in flight, alone
        assert succeeded(db_url) == [first]
        [report] = admin.status(db_url, now=clock.now()).jobs
        assert (report.backfill_queued, report.backfilling) == (0, None)
        assert report.backfill_cancelled == at(1, seconds=60)
        assert (report.backfill_cancelled_by, report.backfill_cancelled_instants) == (
            "ops@laptop",
            3,
        )
        assert report.problems == ()  # a cancellation is no problem
        # On record: the instants closed, each saying who.
        engine = lease.create_engine(db_url)
        try:
            rows = lease.Triggers(lease.LeaseStore(engine)).read(list(asked.ids))
        finally:
            engine.dispose()
        closed = [r for r in rows if r.backfill and r.outcome == "cancelled"]
        assert sorted(r.instant for r in closed) == hours(-3, -2, -1)
        assert {(r.state.value, r.error) for r in closed} == {
            ("refused", "cancelled by ops@laptop")
        }
        # Asked again, the backfill queues them anew: they have no round on record.
        again = admin.backfill(db_url, "report", start=at(-4), end=at(0), now=clock.now())
        assert again.queued == tuple(hours(-3, -2, -1))

    def test_the_command_cancels_says_what_and_status_shows_it(
        self, db_url, replicas, clock, capsys
    ):
        job = Job(clock, seconds=30)
        registry = registry_of(job)
        replicas(registry, "a")
        replicas(registry, "b")
        clock.advance(3600 + 45)
        admin.backfill(db_url, "report", start=at(-4), end=at(0), now=clock.now())
        clock.advance(15)
        capsys.readouterr()
        args = ["backfill", "report", "--cancel", "--by", "ops", "--database-url", db_url]
        assert main(args) == 0
        out = capsys.readouterr().out
        assert out.startswith(
            "cancelled the backfill of report: 3 instant(s) not run, "
            "2026-03-02 06:00:00 to 2026-03-02 08:00:00 UTC; the round of "
            "2026-03-02 05:00:00 UTC in flight ends as ever"
        )
        assert main(args) == 0
        assert capsys.readouterr().out.startswith("no backfill of report is queued")
        assert main([*args, "--json"]) == 0
        said = json.loads(capsys.readouterr().out)
        assert (said["job"], said["cancelled"], said["by"]) == ("report", [], "ops")
        clock.advance(60)
        main(["status", "--database-url", db_url])  # on the database's clock: stale
        out = capsys.readouterr().out
        assert "backfill: cancelled by ops at " in out and "(3 instant(s) not run)" in out

    def test_bad_input_exits_2(self, db_url, replicas, clock, capsys):
        replicas(registry_of(Job(clock)), "a")
        clock.advance(1)
        capsys.readouterr()
        assert main(["backfill", "nope", "--cancel", "--database-url", db_url]) == 2
        assert "'nope'" in capsys.readouterr().err
        args = ["backfill", "report", "--cancel", "--from", "2026-03-01T00:00:00Z"]
        assert main([*args, "--database-url", db_url]) == 2
        assert capsys.readouterr().err == "cronjob backfill: --cancel takes no --from or --to\n"
        assert main(["backfill", "report", "--database-url", db_url]) == 2
        assert "--from and --to are required (or --cancel)" in capsys.readouterr().err
