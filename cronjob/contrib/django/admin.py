"""Django's admin for schedules made of data: list, search, add, edit (their own policies
included), pause, resume and remove the rows of ``cronjob_schedule``.

Django's admin imports this module (its ``autodiscover``) when both
``"django.contrib.admin"`` and ``"cronjob.contrib.django"`` are installed: "Schedules"
then shows under "cronjob". The list shows each schedule's id, task, spec (``@at
<instant>`` for a one-off), zone, whether it is paused and its next instants; it is
searched by id and task.

Every write goes through `cronjob.contrib.django.schedules`, never the ORM: the form's
``clean()`` refuses what [cronjob.schedules.check][] refuses (a spec that does not parse
or never fires shows as the form's error), saving calls ``add`` or ``update``, deleting
calls ``remove``, and the actions "Pause" and "Resume" call ``pause`` and ``resume`` with
the admin user's name as who. The replicas see each change within 2 s, as any.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, ClassVar, TypeVar

from django import forms
from django.contrib import admin
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html_join

from ..._bounds import timing
from ..._clock import Clock, SystemClock
from ..._exceptions import RegistrationError, ScheduleError
from ..._policy import CatchUp, Overlap
from ...schedules import ScheduleRecord
from ...schedules._policies import OWN_POLICIES
from . import schedules
from ._database import database_alias
from .models import Schedule

__all__ = ["NEXT_INSTANTS", "POLICIES", "ScheduleAdmin", "ScheduleForm"]

#: How many next instants the list shows for each schedule.
NEXT_INSTANTS = 3

_F = TypeVar("_F", bound=Callable[..., Any])


def _display(**options: Any) -> Callable[[_F], _F]:
    """``admin.display``, typed (Django ships no hints)."""
    decorator: Callable[[_F], _F] = admin.display(**options)
    return decorator


def _action(**options: Any) -> Callable[[_F], _F]:
    """``admin.action``, typed."""
    decorator: Callable[[_F], _F] = admin.action(**options)
    return decorator


#: The form's fields of a schedule's own policies (empty: its task's): the schedules
#: API's own list.
POLICIES = OWN_POLICIES


def _policy_choices(kind: type[enum.StrEnum]) -> list[tuple[str, str]]:
    """An empty choice (the task's own) and each value of ``kind``."""
    return [("", "the task's"), *((member.value, member.value) for member in kind)]


def _seconds(value: timedelta | None) -> float | None:
    return None if value is None else value.total_seconds()


class ScheduleForm(forms.ModelForm):
    """A schedule's values and its own policies (each left empty is its task's), checked
    by [cronjob.schedules.check][] in ``clean()``.

    A refusal of the spec, ``at``, ``start`` or ``end`` (`ScheduleError`) is an error of
    the spec field when only a spec is given, else of the form; any other refusal
    (`RegistrationError`: the id, task or args) is an error of the form. Datetimes are
    read in Django's current time zone (aware, as the check wants them).
    """

    spec = forms.CharField(
        required=False,
        help_text="Cron spec, e.g. 0 0 9 * * * or CRON_TZ=Europe/Paris 0 0 9 * * 1-5; "
        "leave empty for a one-off at an instant.",
    )
    at = forms.DateTimeField(required=False, help_text="A one-off's one instant.")
    start = forms.DateTimeField(required=False, help_text="No instant before this.")
    end = forms.DateTimeField(required=False, help_text="No instant after this.")
    args = forms.JSONField(
        required=False, initial=dict, help_text="A JSON object: the arguments rounds see."
    )
    paused = forms.BooleanField(required=False, help_text="Added paused.")
    overlap = forms.ChoiceField(
        required=False,
        choices=_policy_choices(Overlap),
        help_text="An instant that falls while a round of this schedule runs.",
    )
    catch_up = forms.ChoiceField(
        required=False,
        choices=_policy_choices(CatchUp),
        help_text="The missed instants (no replica ran them) that run late.",
    )
    catch_up_window = forms.FloatField(
        required=False, help_text="Seconds: how far back missed instants run; empty: the task's."
    )
    jitter = forms.FloatField(
        required=False,
        help_text="Seconds: each round starts up to this late, at random; empty: the task's.",
    )
    heartbeat = forms.CharField(
        required=False, help_text="A URL pinged as rounds start and end; empty: the task's."
    )

    class Meta:
        model = Schedule
        fields = ("id", "task")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance._state.adding:
            return
        self.fields.pop("paused", None)  # an action pauses and resumes
        record = schedules.get(self.instance.pk)
        if record is not None:
            self.initial.update(
                spec=record.spec,
                at=record.at,
                start=record.start,
                end=record.end,
                args=record.args,
                overlap=record.overlap or "",
                catch_up=record.catch_up or "",
                catch_up_window=_seconds(record.catch_up_window),
                jitter=_seconds(record.jitter),
                heartbeat=record.heartbeat or "",
            )

    def schedule_id(self) -> str | None:
        """The id: the field's when adding, the row's when editing."""
        if self.instance._state.adding:
            value = self.cleaned_data.get("id")
            return value if isinstance(value, str) else None
        return str(self.instance.pk)

    def values(self) -> dict[str, Any]:
        """The cleaned values as `schedules.add` and `schedules.update` take them: an empty
        policy is ``None``, the task's own (``update`` gives it back to the task)."""
        data: dict[str, Any] = self.cleaned_data
        return {
            "task": data.get("task"),
            "spec": data.get("spec") or None,
            "at": data.get("at"),
            "args": data.get("args") or {},
            "start": data.get("start"),
            "end": data.get("end"),
            "overlap": data.get("overlap") or None,
            "catch_up": data.get("catch_up") or None,
            "catch_up_window": data.get("catch_up_window"),
            "jitter": data.get("jitter"),
            "heartbeat": data.get("heartbeat") or None,
        }

    def clean(self) -> dict[str, Any]:
        """The values, refused with the message of [cronjob.schedules.check][]."""
        data: dict[str, Any] = dict(super().clean())
        id_ = self.schedule_id()
        if id_ is None or not data.get("task"):
            return data  # the missing field's own error says so
        values = self.values()
        try:
            schedules.check(id_, **values)
        except ScheduleError as exc:
            spec_only = values["spec"] is not None and values["at"] is None
            self.add_error("spec" if spec_only else None, str(exc))
        except RegistrationError as exc:
            self.add_error(None, str(exc))
        return data


class ScheduleAdmin(admin.ModelAdmin):
    """The admin of `Schedule`, writing through `cronjob.contrib.django.schedules`.

    ``clock`` gives "now" for the next instants shown (tests set a fake one).
    """

    form = ScheduleForm
    list_display = ("id", "task", "shown_spec", "zone", "is_paused", "next_instants")
    search_fields = ("id", "task")
    actions = ("pause_schedules", "resume_schedules")
    fields = ("id", "task", "spec", "at", "start", "end", "args", "paused", *POLICIES)
    #: Where "now" is read for the next instants.
    clock: ClassVar[Clock] = SystemClock()

    def get_queryset(self, request: HttpRequest) -> QuerySet[Schedule]:
        return super().get_queryset(request).using(database_alias())

    def get_fields(self, request: HttpRequest, obj: Schedule | None = None) -> list[str]:
        if obj is None:
            return list(self.fields)
        return [name for name in self.fields if name != "paused"]

    def get_readonly_fields(
        self, request: HttpRequest, obj: Schedule | None = None
    ) -> tuple[str, ...]:
        return ("id",) if obj is not None else ()

    # -- the list ---------------------------------------------------------------------------

    def record(self, obj: Schedule) -> ScheduleRecord | None:
        """``obj`` as `schedules.get` reads it (once per row and request)."""
        if not hasattr(obj, "_cronjob_record"):
            obj._cronjob_record = schedules.get(obj.pk)
        found: ScheduleRecord | None = obj._cronjob_record
        return found

    @_display(description="spec / at")
    def shown_spec(self, obj: Schedule) -> str:
        record = self.record(obj)
        return "" if record is None else record.shown_spec

    @_display(description="zone")
    def zone(self, obj: Schedule) -> str:
        record = self.record(obj)
        if record is None:
            return ""
        try:
            schedule = timing(record.spec, record.at, record.start, record.end)
        except ScheduleError:
            return "?"  # a spec this release cannot read (a newer one's)
        zone = getattr(schedule, "zone", None)
        return "UTC" if zone is None else str(zone.key)

    @_display(description="paused", boolean=True)
    def is_paused(self, obj: Schedule) -> bool | None:
        record = self.record(obj)
        return None if record is None else record.paused

    @_display(description="next instants (UTC)")
    def next_instants(self, obj: Schedule) -> str:
        record = self.record(obj)
        if record is None:
            return ""
        shown = [instant.strftime("%Y-%m-%d %H:%M:%SZ") for instant in self.following(record)]
        return format_html_join("", "<div>{}</div>", ((text,) for text in shown)) or "none"

    def following(self, record: ScheduleRecord) -> list[datetime]:
        """The next `NEXT_INSTANTS` instants of ``record`` after the clock's now (fewer
        for a one-off or a bounded one; none for a spec this release cannot read)."""
        try:
            schedule = timing(record.spec, record.at, record.start, record.end)
        except ScheduleError:
            return []
        found: list[datetime] = []
        after = self.clock.now()
        while len(found) < NEXT_INSTANTS:
            instant = schedule.next(after)
            if instant is None:
                break
            found.append(instant)
            after = instant
        return found

    # -- the writes --------------------------------------------------------------------------

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        """``schedules.update`` of an edited schedule, ``schedules.add`` of a new one."""
        assert isinstance(form, ScheduleForm)
        id_ = form.schedule_id()
        assert id_ is not None
        obj.pk = id_
        if change:
            schedules.update(id_, **form.values())
        else:
            paused = bool(form.cleaned_data.get("paused"))
            schedules.add(id_, paused=paused, **form.values())

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        """Nothing: a schedule has no related rows."""

    def delete_model(self, request: HttpRequest, obj: Schedule) -> None:
        """``schedules.remove``."""
        schedules.remove(obj.pk)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        """``schedules.remove`` of each, in one transaction."""
        with transaction.atomic(using=database_alias()):
            for id_ in _ids(queryset):
                schedules.remove(id_)

    @_action(description="Pause selected schedules", permissions=["change"])
    def pause_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        """``schedules.pause`` of each, by the admin user."""
        by = _who(request)
        with transaction.atomic(using=database_alias()):
            changed = sum(schedules.pause(id_, by=by) for id_ in _ids(queryset))
        self.message_user(request, f"Paused {changed} schedule(s).")

    @_action(description="Resume selected schedules", permissions=["change"])
    def resume_schedules(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        """``schedules.resume`` of each, by the admin user."""
        by = _who(request)
        with transaction.atomic(using=database_alias()):
            changed = sum(schedules.resume(id_, by=by) for id_ in _ids(queryset))
        self.message_user(request, f"Resumed {changed} schedule(s).")


def _ids(queryset: QuerySet[Schedule]) -> Iterable[str]:
    return list(queryset.values_list("id", flat=True))


def _who(request: HttpRequest) -> str | None:
    """Who pauses: the admin user's name (``None``: this process's ``user@host``)."""
    user = getattr(request, "user", None)
    name = user.get_username() if user is not None else ""
    return f"{name} (admin)" if name else None


admin.site.register(Schedule, ScheduleAdmin)
