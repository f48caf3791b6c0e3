"""The operator's side of schedules made of data: ``status`` (API, command, page) shows
a schedule with its task, ``cronjob schedules`` lists them, and ``pause``, ``resume``,
``trigger``, ``history`` and ``forget`` take a schedule's id.

The state is built without a scheduler: schedules with `cronjob.schedules.add`, replica
records with `lease.LeaseStore.record_replica` (a replica's record lists the tasks it
registers), a round in flight with a claim. Everything is on the database's clock, which
`status` reads as "now", so the replicas recorded here are live.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

import lease
from cronjob import admin, schedules, web
from cronjob.admin._cli import main
from tests._helpers import statements, wsgi_call

#: A spec that never fires within a test: 09:00 on 1 January.
YEARLY = "0 0 9 1 1 *"


def now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def live_replica(
    engine: sa.Engine,
    holder: str = "r1",
    *,
    tasks: frozenset[str] = frozenset({"report"}),
    jobs: dict[str, tuple[str, bool]] | None = None,
    policies: dict[str, dict[str, object]] | None = None,
) -> None:
    """Put replica ``holder`` on record as seen now, registering ``tasks`` and ``jobs``
    (with ``policies``, by name)."""
    lease.LeaseStore(engine).record_replica(
        lease.ReplicaRow(
            holder=holder,
            host="h",
            pid=1,
            version="v",
            started=now(),
            seen=now(),
            jobs={} if jobs is None else jobs,
            tasks=tasks,
            policies={} if policies is None else policies,
        )
    )


def replica_on_clock(engine: sa.Engine, seen: datetime, *, started: datetime) -> None:
    """Replica ``r1``, registering task ``report``, seen at ``seen`` (a lease clock of
    its own) after it started at ``started``."""
    lease.LeaseStore(engine, clock=lambda: seen).record_replica(
        lease.ReplicaRow(
            holder="r1",
            host="h",
            pid=1,
            version="v",
            started=started,
            seen=seen,
            jobs={},
            tasks=frozenset({"report"}),
        )
    )


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def job(report: admin.Status, name: str) -> admin.JobStatus:
    (found,) = [j for j in report.jobs if j.name == name]
    return found


@pytest.fixture
def db(migrated_engine: sa.Engine, db_url: str) -> Iterator[tuple[sa.Engine, str]]:
    """The tables at head on each database: an engine and its URL (for the command)."""
    yield migrated_engine, db_url


class TestStatus:
    def test_a_schedule_shows_its_task_spec_and_next_instant_within_its_start(self, db):
        engine, _ = db
        start = datetime(2031, 6, 1, tzinfo=UTC)
        schedules.add(engine, "report:42", task="report", spec="0 0 9 * * *", start=start)
        live_replica(engine, jobs={"tick": ("0 * * * * *", True)})
        report = admin.status(engine)
        found = job(report, "report:42")
        assert (found.task, found.spec) == ("report", "0 0 9 * * *")
        assert found.next_instant == datetime(2031, 6, 1, 9, 0, tzinfo=UTC)
        assert found.activity is admin.Activity.IDLE and found.problems == ()
        assert report.retired == () and report.healthy

    def test_a_registered_job_is_its_own_task(self, db):
        engine, _ = db
        live_replica(engine, jobs={"tick": ("0 * * * * *", True)})
        assert job(admin.status(engine), "tick").task == "tick"

    def test_a_one_off_schedule_shows_at_and_its_instant(self, db):
        engine, _ = db
        at = datetime(2031, 1, 5, 8, 0, tzinfo=UTC)
        schedules.add(engine, "remind:1", task="report", at=at)
        live_replica(engine)
        found = job(admin.status(engine), "remind:1")
        assert (found.spec, found.next_instant) == ("@at 2031-01-05T08:00:00Z", at)

    def test_a_schedule_past_its_end_has_no_next_instant(self, db):
        engine, _ = db
        end = datetime(2020, 1, 1, tzinfo=UTC)
        schedules.add(engine, "old", task="report", spec="0 0 9 * * *", end=end)
        live_replica(engine)
        found = job(admin.status(engine), "old")
        assert found.next_instant is None and found.problems == ()

    def test_a_schedule_whose_task_no_live_replica_registers_is_a_problem(self, db):
        engine, _ = db
        schedules.add(engine, "report:42", task="report", spec=YEARLY)
        live_replica(engine, tasks=frozenset({"other"}))
        report = admin.status(engine)
        found = job(report, "report:42")
        assert found.problems == ("no replica runs task report",)
        assert found.activity is admin.Activity.ORPHANED  # never retired, nor idle
        assert not report.healthy and report.retired == ()
        assert report.problems == ("report:42: no replica runs task report",)

    def test_with_no_live_replica_a_schedule_has_no_problem(self, db):
        engine, _ = db
        schedules.add(engine, "report:42", task="report", spec=YEARLY)
        report = admin.status(engine)
        assert job(report, "report:42").problems == () and report.healthy

    def test_a_schedule_without_a_success_within_two_periods_is_stale(self, db):
        engine, _ = db
        schedules.add(engine, "every-5m", task="report", spec="0 */5 * * * *")
        later = now() + timedelta(hours=1)
        replica_on_clock(engine, later, started=now())
        found = job(admin.status(engine, now=later), "every-5m")
        # No replica here really runs it: its instants are missed too.
        assert [p.split(":")[0] for p in found.problems] == ["stale", "missed"]

    def test_a_schedule_added_after_its_replicas_started_is_not_stale_before_its_time(self, db):
        engine, _ = db
        schedules.add(engine, "every-5m", task="report", spec="0 */5 * * * *")
        later = now() + timedelta(minutes=5)
        replica_on_clock(engine, later, started=now() - timedelta(days=1))
        problems = job(admin.status(engine, now=later), "every-5m").problems
        # No replica here really runs it: its one instant, past the grace, is missed.
        assert [p for p in problems if not p.startswith("missed: ")] == []

    def test_the_schedules_table_is_read_in_one_query(self, db):
        engine, _ = db
        schedules.add_many(
            engine, [schedules.New(f"s{i}", task="report", spec=YEARLY) for i in range(20)]
        )
        live_replica(engine)
        table = re.compile(r"\bcronjob_schedule\b(?!_)")
        with statements(engine, lambda sql: bool(table.search(sql))) as sent:
            report = admin.status(engine)
        assert len(sent) == 1
        assert [j.name for j in report.jobs] == sorted(f"s{i}" for i in range(20))

    def test_a_removed_schedule_is_hidden_not_retired(self, db):
        engine, _ = db
        schedules.add(engine, "gone", task="report", spec=YEARLY)
        schedules.add(engine, "kept", task="report", spec=YEARLY)
        assert schedules.remove(engine, "gone")
        live_replica(engine)
        report = admin.status(engine)
        assert [j.name for j in report.jobs] == ["kept"]
        assert report.retired == () and report.healthy

    def test_a_removed_schedule_with_a_round_running_shows_until_the_round_ends(self, db):
        engine, _ = db
        store = lease.LeaseStore(engine)
        schedules.add(engine, "gone", task="report", spec=YEARLY)
        live_replica(engine)
        (claim,) = store.claim(["gone"], datetime.fromtimestamp(store.now_ms() // 1000, UTC), "r1")
        schedules.remove(engine, "gone")
        found = job(admin.status(engine), "gone")
        assert found.activity is admin.Activity.RUNNING and found.running_on == "r1"
        assert (found.task, found.next_instant, found.problems) == ("report", None, ())
        assert store.finish("gone", claim.token, ended=now())
        assert [j.name for j in admin.status(engine).jobs] == []

    def test_a_paused_schedule_has_no_next_instant(self, db):
        engine, _ = db
        schedules.add(engine, "report:42", task="report", spec=YEARLY, paused=True)
        live_replica(engine)
        found = job(admin.status(engine), "report:42")
        assert found.paused and found.next_instant is None


class TestControl:
    def test_pause_and_resume_take_a_schedule_id(self, db):
        engine, _ = db
        schedules.add(engine, "report:42", task="report", spec=YEARLY)
        live_replica(engine)
        assert admin.pause(engine, "report:42", reason="tenant away").paused
        assert job(admin.status(engine), "report:42").paused
        assert not admin.resume(engine, "report:42").paused

    def test_resume_catches_up_a_one_off_skipped_while_paused_from_its_own_row(self, db):
        engine, _ = db
        at = now() - timedelta(hours=1)
        schedules.add(engine, "remind:1", task="report", at=at)
        admin.pause(engine, "remind:1", now=at - timedelta(hours=1))
        assert admin.resume(engine, "remind:1", catch_up=True).catch_up == at

    def test_resume_catches_up_within_a_schedules_bounds(self, db):
        engine, _ = db
        end = now() - timedelta(hours=3)  # its last instant, on the hour, is before the pause
        schedules.add(engine, "hourly", task="report", spec="0 0 * * * *", end=end)
        admin.pause(engine, "hourly", now=end + timedelta(minutes=1))
        assert admin.resume(engine, "hourly", catch_up=True).catch_up is None

    def test_trigger_takes_a_schedule_id_and_names_the_replicas_of_its_task(self, db):
        engine, _ = db
        schedules.add(engine, "report:42", task="report", spec=YEARLY)
        live_replica(engine, "r1")
        live_replica(engine, "r2", tasks=frozenset({"other"}))
        request = admin.trigger(engine, "report:42")
        assert request.live_replicas == ("r1",) and not request.no_live_replica
        (pending,) = admin.requests(engine, request.ids)
        assert pending.job == "report:42" and pending.state is admin.RequestState.PENDING

    def test_trigger_of_a_schedule_no_live_replica_runs_says_so(self, db):
        engine, _ = db
        schedules.add(engine, "report:42", task="report", spec=YEARLY)
        live_replica(engine, tasks=frozenset({"other"}))
        assert admin.trigger(engine, "report:42").no_live_replica

    def test_a_removed_schedule_is_refused_by_pause_resume_and_trigger(self, db):
        engine, _ = db
        schedules.add(engine, "gone", task="report", spec=YEARLY)
        schedules.remove(engine, "gone")
        live_replica(engine)
        for act in (admin.pause, admin.resume, admin.trigger):
            with pytest.raises(admin.UnknownJob, match="was removed"):
                act(engine, "gone")
        assert admin.requests(engine) == ()

    def test_history_takes_a_schedule_id_also_once_removed(self, db):
        engine, _ = db
        schedules.add(engine, "report:42", task="report", spec=YEARLY)
        admin.pause(engine, "report:42")  # noted in the history
        assert [r.why for r in admin.history(engine, "report:42")] == [admin.Why.PAUSE]
        schedules.remove(engine, "report:42")
        assert len(admin.history(engine, "report:42")) == 1

    def test_forget_refuses_a_live_schedule_and_forgets_a_removed_one(self, db):
        engine, _ = db
        schedules.add(engine, "report:42", task="report", spec=YEARLY)
        live_replica(engine)
        with pytest.raises(admin.ForgetRefused, match=r"schedules\.remove"):
            admin.forget(engine, "report:42")
        assert schedules.get(engine, "report:42") is not None
        schedules.remove(engine, "report:42")
        assert admin.forget(engine, "report:42").lease_row


class TestCommands:
    def test_status_shows_the_task_column_and_exits_1_when_no_replica_runs_a_task(self, db, capsys):
        engine, url = db
        schedules.add(engine, "report:42", task="report", spec=YEARLY)
        schedules.add(engine, "sync:1", task="sync", spec=YEARLY)
        live_replica(engine)
        status, out, err = run(capsys, "status", "--database-url", url)
        assert status == 1
        lines = out.splitlines()
        assert lines[0].split()[:3] == ["JOB", "TASK", "SPEC"]
        assert lines[1].split()[:2] == ["report:42", "report"]
        assert lines[2].split()[:2] == ["sync:1", "sync"]
        assert err == "cronjob: job needs attention: sync:1: no replica runs task sync\n"
        # The STATE column says what it is: no replica runs it.
        assert "orphaned" in lines[2].split() and "idle" not in lines[2].split()

    def test_status_lists_the_tasks_each_replica_registers(self, db, capsys):
        engine, url = db
        live_replica(engine, "r1", tasks=frozenset({"sync", "report"}))
        live_replica(engine, "r2", tasks=frozenset(), jobs={"tick": ("0 * * * * *", True)})
        assert [r.tasks for r in admin.status(engine).replicas] == [("report", "sync"), ()]
        _, out, _ = run(capsys, "status", "--database-url", url)
        lines = out.splitlines()
        header = lines.index(next(line for line in lines if line.startswith("REPLICA")))
        assert lines[header].split()[-1] == "TASKS"
        assert lines[header + 1].endswith(" report, sync")
        assert lines[header + 2].endswith(" -")

    def test_status_json_has_the_task_and_the_problem(self, db, capsys):
        engine, url = db
        schedules.add(engine, "sync:1", task="sync", spec=YEARLY)
        live_replica(engine)
        status, out, _ = run(capsys, "status", "--json", "--database-url", url)
        report = json.loads(out)
        assert status == 1 and report["healthy"] is False
        (found,) = report["jobs"]
        assert found["task"] == "sync" and found["problems"] == ["no replica runs task sync"]
        assert found["activity"] == "orphaned"

    def test_status_task_filters_to_the_schedules_of_a_task(self, db, capsys):
        engine, url = db
        schedules.add(engine, "report:1", task="report", spec=YEARLY)
        schedules.add(engine, "report:2", task="report", spec=YEARLY)
        schedules.add(engine, "sync:1", task="sync", spec=YEARLY)
        live_replica(engine)
        status, out, _ = run(capsys, "status", "--task", "report", "--json", "--database-url", url)
        assert status == 0  # sync:1's problem is filtered out with it
        assert [j["name"] for j in json.loads(out)["jobs"]] == ["report:1", "report:2"]
        status, _, err = run(capsys, "status", "--task", "nope", "--database-url", url)
        assert status == 2 and "no schedule of task 'nope'" in err

    def test_schedules_lists_them_by_id_with_the_size_of_their_args_not_the_args(self, db, capsys):
        engine, url = db
        at = datetime(2031, 1, 5, 8, 0, tzinfo=UTC)
        secret = {"token": "s3cr3t"}
        schedules.add(engine, "remind:9", task="remind", at=at, args=secret)
        start = datetime(2031, 6, 1, tzinfo=UTC)
        schedules.add(engine, "report:1", task="report", spec="0 0 9 * * *", start=start)
        status, out, err = run(capsys, "schedules", "--database-url", url)
        assert (status, err) == (0, "")
        lines = out.splitlines()
        assert lines[0].split() == [
            "ID", "TASK", "SPEC", "NEXT", "(UTC)", "START", "(UTC)", "END", "(UTC)", "ARGS",
            "(BYTES)",
        ]  # fmt: skip
        assert lines[1].split() == [
            "remind:9", "remind", "@at", "2031-01-05T08:00:00Z", "2031-01-05", "08:00:00",
            "-", "-", str(len(json.dumps(secret, separators=(",", ":")))),
        ]  # fmt: skip
        assert lines[2].split() == [
            "report:1", "report", "0", "0", "9", "*", "*", "*", "2031-06-01", "09:00:00",
            "2031-06-01", "00:00:00", "-", "2",
        ]  # fmt: skip
        assert "s3cr3t" not in out

    def test_schedules_filters_by_task_and_prefix(self, db, capsys):
        engine, url = db
        for id_, task in (("a:1", "report"), ("a:2", "sync"), ("b:1", "report")):
            schedules.add(engine, id_, task=task, spec=YEARLY)
        _, out, _ = run(capsys, "schedules", "--task", "report", "--database-url", url)
        assert [line.split()[0] for line in out.splitlines()[1:]] == ["a:1", "b:1"]
        _, out, _ = run(capsys, "schedules", "--prefix", "a:", "--database-url", url)
        assert [line.split()[0] for line in out.splitlines()[1:]] == ["a:1", "a:2"]
        status, out, _ = run(capsys, "schedules", "--prefix", "zz", "--database-url", url)
        assert (status, out) == (0, "no schedules with prefix 'zz' on record\n")

    def test_schedules_json_has_the_args_and_leaves_removed_ones_out(self, db, capsys):
        engine, url = db
        schedules.add(engine, "report:1", task="report", spec=YEARLY, args={"tenant": 1})
        schedules.add(engine, "report:2", task="report", spec=YEARLY)
        schedules.remove(engine, "report:2")
        admin.pause(engine, "report:1")
        status, out, _ = run(capsys, "schedules", "--json", "--database-url", url)
        (found,) = json.loads(out)
        assert status == 0
        assert (found["id"], found["task"], found["args"]) == ("report:1", "report", {"tenant": 1})
        assert found["paused"] is True and found["next_instant"] is None

    @pytest.mark.blank_database
    def test_schedules_without_the_tables_says_so_and_exits_2(self, db_url, capsys):
        status, out, err = run(capsys, "schedules", "--database-url", db_url)
        assert (status, out) == (2, "")
        assert err.startswith("cronjob: error: no cronjob tables")

    def test_pause_trigger_and_history_take_a_schedule_id_and_forget_refuses_it(self, db, capsys):
        engine, url = db
        schedules.add(engine, "report:42", task="report", spec=YEARLY)
        live_replica(engine)
        status, out, _ = run(capsys, "pause", "report:42", "--database-url", url)
        assert status == 0 and out.startswith("paused report:42")
        status, _, _ = run(capsys, "resume", "report:42", "--database-url", url)
        assert status == 0
        status, out, _ = run(capsys, "trigger", "report:42", "--database-url", url)
        assert status == 0 and out.startswith("requested a round of report:42 now")
        status, out, _ = run(capsys, "history", "report:42", "--json", "--database-url", url)
        assert status == 0 and len(json.loads(out)) == 2  # the pause and the resume
        status, _, err = run(capsys, "forget", "report:42", "--database-url", url)
        assert status == 2 and "schedules.remove" in err


class TestPage:
    def test_the_page_shows_the_task_the_problem_and_the_replicas_tasks_escaped(self, db):
        engine, _ = db
        schedules.add(engine, "report:<b>", task="report", spec=YEARLY)
        schedules.add(engine, "sync:1", task="sync<i>", spec=YEARLY)
        live_replica(engine)
        status, _, body = wsgi_call(web.wsgi_app(engine), "/")
        assert status.startswith("200")
        assert "<th>Task</th>" in body
        assert "report:&lt;b&gt;" in body and "<b>" not in body and "<i>" not in body
        assert "no replica runs task sync&lt;i&gt;" in body
        assert ">orphaned<" in body  # its state, as the table's
        assert "<th>Tasks</th>" in body and '<td data-label="Tasks" class=soft>report</td>' in body

    def test_a_schedules_own_page_names_its_task(self, db):
        engine, _ = db
        schedules.add(engine, "report:42", task="report", spec=YEARLY)
        live_replica(engine)
        status, _, body = wsgi_call(web.wsgi_app(engine), "/job", "name=report%3A42")
        assert status.startswith("200")
        assert "<dt>Task</dt><dd>report</dd>" in body


def test_a_start_in_the_past_does_not_hide_the_next_instant(db):
    engine, _ = db
    start = now() - timedelta(days=30)
    schedules.add(engine, "report:42", task="report", spec=YEARLY, start=start)
    found = job(admin.status(engine), "report:42")
    assert found.next_instant is not None and found.next_instant.month == 1
