"""Run by Django's test runner with ``admin_settings`` (SQLite, PostgreSQL, MariaDB), from
tests/test_django_admin.py: the admin of schedules (`cronjob.contrib.django.admin`)
writes through `cronjob.contrib.django.schedules` and shows its refusals as form errors.

Requests go through Django's test client as a logged-in superuser; what they wrote is
read back with `schedules.get`, and each write is checked to be the schedules API's."""

from datetime import UTC, datetime, timedelta
from unittest import mock

import sqlalchemy as sa
from django.contrib.auth.models import User
from django.test import TransactionTestCase
from sqlalchemy.pool import NullPool

import lease
from cronjob.contrib.django import admin as cronjob_admin
from cronjob.contrib.django import database_url, schedules
from cronjob.contrib.django.models import Schedule
from cronjob.testing import FakeClock

NOW = datetime(2027, 1, 4, 8, 0, tzinfo=UTC)
DAILY = "0 0 9 * * *"
LIST = "/admin/cronjob/schedule/"


def change_url(id_):
    from django.contrib.admin.utils import quote

    return f"{LIST}{quote(id_)}/change/"


class TestScheduleAdmin(TransactionTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        engine = lease.create_engine(database_url())
        try:
            lease.migrate(engine)
        finally:
            engine.dispose()

    def setUp(self):
        engine = sa.create_engine(database_url(), poolclass=NullPool)
        try:
            with engine.begin() as conn:
                conn.execute(sa.text("DELETE FROM cronjob_schedule"))
                conn.execute(sa.text("DELETE FROM cronjob_lease"))
        finally:
            engine.dispose()
        user = User.objects.create_superuser("ops", "ops@example.com", "secret")
        self.client.force_login(user)
        clock = mock.patch.object(cronjob_admin.ScheduleAdmin, "clock", FakeClock(NOW))
        clock.start()
        self.addCleanup(clock.stop)

    def add(self, **data):
        form = {"id": "report:1", "task": "report", "spec": DAILY, "args": "{}", **data}
        return self.client.post(f"{LIST}add/", form)

    def test_adding_calls_schedules_add_and_lists_the_next_instants(self):
        with mock.patch.object(schedules, "add", wraps=schedules.add) as add:
            response = self.add(args='{"tenant": 42}')
        assert response.status_code == 302, response.content.decode()[-3000:]
        add.assert_called_once()
        record = schedules.get("report:1")
        assert (record.task, record.spec, record.args, record.paused) == (
            "report",
            DAILY,
            {"tenant": 42},
            False,
        )
        page = self.client.get(LIST).content.decode()
        assert "report:1" in page
        assert "2027-01-04 09:00:00Z" in page and "2027-01-06 09:00:00Z" in page
        assert "2027-01-07" not in page  # three instants

    def test_a_zoned_spec_shows_its_zone(self):
        self.add(spec="CRON_TZ=Europe/Paris 0 0 9 * * *")
        page = self.client.get(LIST).content.decode()
        assert "Europe/Paris" in page
        # 09:00 in Paris is 08:00 UTC in January (UTC+1); now is that instant: the next day.
        assert "2027-01-05 08:00:00Z" in page and "2027-01-04 08:00:00Z" not in page

    def test_a_bad_spec_is_the_forms_error_and_nothing_is_written(self):
        with mock.patch.object(schedules, "add", wraps=schedules.add) as add:
            response = self.add(spec="0 0 0 30 2 *")
        assert response.status_code == 200
        form = response.context["adminform"].form
        assert form.errors["spec"] == [
            "schedule 'report:1': '0 0 0 30 2 *' never fires: day-of-month 30 never occurs "
            "in February"
        ]
        add.assert_not_called()
        assert schedules.get("report:1") is None

    def test_a_bad_id_or_args_is_the_forms_error(self):
        response = self.add(args="[1, 2]")
        errors = response.context["adminform"].form.non_field_errors()
        assert errors == ["schedule 'report:1': args must be a dict, got list"]
        assert schedules.get("report:1") is None

    def test_editing_calls_schedules_update(self):
        schedules.add("report:1", task="report", spec=DAILY)
        page = self.client.get(change_url("report:1")).content.decode()
        assert DAILY in page  # the form starts from the record
        with mock.patch.object(schedules, "update", wraps=schedules.update) as update:
            response = self.client.post(
                change_url("report:1"),
                {"task": "report", "spec": "0 30 9 * * *", "args": '{"n": 2}'},
            )
        assert response.status_code == 302, response.content.decode()[-3000:]
        update.assert_called_once()
        record = schedules.get("report:1")
        assert (record.spec, record.args) == ("0 30 9 * * *", {"n": 2})

    def test_adding_with_policies_writes_the_schedules_own(self):
        response = self.add(
            overlap="buffer_one",
            catch_up="all",
            catch_up_window="3600",
            jitter="5",
            heartbeat="https://hc.example/ping/1",
        )
        assert response.status_code == 302, response.content.decode()[-3000:]
        record = schedules.get("report:1")
        assert (record.overlap, record.catch_up) == ("buffer_one", "all")
        assert (record.catch_up_window, record.jitter) == (timedelta(hours=1), timedelta(seconds=5))
        assert record.heartbeat == "https://hc.example/ping/1"

    def test_editing_starts_from_the_policies_and_an_emptied_one_goes_back_to_the_task(self):
        schedules.add(
            "report:1", task="report", spec=DAILY, overlap="cancel_other", jitter=7, catch_up="none"
        )
        form = self.client.get(change_url("report:1")).context["adminform"].form
        assert (form.initial["overlap"], form.initial["catch_up"]) == ("cancel_other", "none")
        assert (form.initial["jitter"], form.initial["catch_up_window"]) == (7.0, None)
        with mock.patch.object(schedules, "update", wraps=schedules.update) as update:
            response = self.client.post(
                change_url("report:1"),
                {"task": "report", "spec": DAILY, "args": "{}", "overlap": "", "jitter": "7"},
            )
        assert response.status_code == 302, response.content.decode()[-3000:]
        assert update.call_args.kwargs["overlap"] is None
        record = schedules.get("report:1")
        assert (record.overlap, record.catch_up, record.jitter) == (
            None,
            None,
            timedelta(seconds=7),
        )

    def test_a_refused_policy_is_the_forms_error_and_nothing_is_written(self):
        with mock.patch.object(schedules, "add", wraps=schedules.add) as add:
            response = self.add(jitter="-1")
        assert response.status_code == 200
        errors = response.context["adminform"].form.non_field_errors()
        assert errors == ["schedule 'report:1': jitter must be positive, got -1.0"]
        add.assert_not_called()
        assert schedules.get("report:1") is None

    def test_editing_to_a_one_off_instant(self):
        schedules.add("report:1", task="report", spec=DAILY)
        response = self.client.post(
            change_url("report:1"),
            {"task": "report", "spec": "", "at_0": "2027-02-01", "at_1": "10:00:00"},
        )
        if response.status_code == 200:  # a split widget or not: Django's own choice
            response = self.client.post(
                change_url("report:1"),
                {"task": "report", "spec": "", "at": "2027-02-01 10:00:00"},
            )
        assert response.status_code == 302, response.content.decode()[-3000:]
        record = schedules.get("report:1")
        assert (record.spec, record.at) == (None, datetime(2027, 2, 1, 10, tzinfo=UTC))

    def test_the_actions_pause_and_resume_through_the_schedules_api(self):
        schedules.add("report:1", task="report", spec=DAILY)
        schedules.add("report:2", task="report", spec=DAILY)
        with mock.patch.object(schedules, "pause", wraps=schedules.pause) as pause:
            self.client.post(LIST, {"action": "pause_schedules", "_selected_action": ["report:1"]})
        pause.assert_called_once_with("report:1", by="ops (admin)")
        assert schedules.get("report:1").paused and not schedules.get("report:2").paused
        self.client.post(LIST, {"action": "resume_schedules", "_selected_action": ["report:1"]})
        assert not schedules.get("report:1").paused

    def test_deleting_calls_schedules_remove(self):
        schedules.add("report:1", task="report", spec=DAILY)
        schedules.add("report:2", task="report", spec=DAILY)
        with mock.patch.object(schedules, "remove", wraps=schedules.remove) as remove:
            response = self.client.post(
                change_url("report:1").replace("change", "delete"), {"post": "yes"}
            )
            assert response.status_code == 302
            self.client.post(
                LIST,
                {"action": "delete_selected", "_selected_action": ["report:2"], "post": "yes"},
            )
        assert [c.args for c in remove.call_args_list] == [("report:1",), ("report:2",)]
        assert schedules.list() == []
        assert Schedule.objects.count() == 0  # the tombstones stay out of the list

    def test_search_by_id_and_task(self):
        schedules.add("report:1", task="report", spec=DAILY)
        schedules.add("bill:1", task="billing", spec=DAILY)
        page = self.client.get(LIST, {"q": "bill"}).content.decode()
        assert "bill:1" in page and "report:1" not in page
        page = self.client.get(LIST, {"q": "report:1"}).content.decode()
        assert "report:1" in page and "bill:1" not in page

    def test_the_model_refuses_the_orms_writes(self):
        schedules.add("report:1", task="report", spec=DAILY)
        row = Schedule.objects.get(pk="report:1")
        with self.assertRaisesRegex(TypeError, "written with cronjob.contrib.django.schedules"):
            row.save()
        with self.assertRaisesRegex(TypeError, "removed with cronjob.contrib.django.schedules"):
            row.delete()
