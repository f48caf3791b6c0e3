"""What a schedule made of data must be before it is written: every value checked at the
call, naming the schedule's id, so that nothing is written of a bad one."""

from __future__ import annotations

import json
from dataclasses import KW_ONLY, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import lease

from .._bounds import EARLIEST_INSTANT, LATEST_INSTANT, timing
from .._exceptions import RegistrationError, ScheduleError
from .._policy import CatchUp, Overlap
from .._registry import Registry, _check_name
from ._policies import OWN_POLICIES, policies_json

__all__ = ["MAX_ARGS_BYTES", "New", "check", "checked"]

_TICK: Final = timedelta(microseconds=1)
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)

#: The most a schedule's arguments may take, encoded as JSON (UTF-8).
MAX_ARGS_BYTES: Final = 64 * 1024


@dataclass(frozen=True, slots=True)
class New:
    """A schedule to add, for [add_many][cronjob.schedules.add_many]: the arguments of
    [add][cronjob.schedules.add] as a value.

    ``New("report:tenant-42", task="tenant-report", spec="0 0 9 * * *", args={...})``

    The policies after ``paused`` are keyword-only; each left ``None`` is the task's own.
    """

    id: str
    task: str
    spec: str | None = None
    at: datetime | None = None
    args: dict[str, Any] = field(default_factory=dict)
    start: datetime | None = None
    end: datetime | None = None
    paused: bool = False
    _: KW_ONLY
    overlap: Overlap | str | None = None
    catch_up: CatchUp | str | None = None
    catch_up_window: float | timedelta | None = None
    jitter: float | timedelta | None = None
    heartbeat: str | None = None


def _aware(id_: str, what: str, value: object) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise ScheduleError(f"schedule {id_!r}: {what} must be a datetime, got {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ScheduleError(
            f"schedule {id_!r}: {what} {value.isoformat()} is naive; give it a zone "
            "(datetime(..., tzinfo=UTC))"
        )
    try:
        instant = value.astimezone(UTC)
    except OverflowError:  # datetime.max west of UTC, datetime.min east of it
        instant = None
    if instant is None or not EARLIEST_INSTANT <= instant < LATEST_INSTANT:
        raise ScheduleError(
            f"schedule {id_!r}: {what} {value.isoformat()} lies outside the instants a "
            f"schedule may name, from {EARLIEST_INSTANT.isoformat()} to before "
            f"{LATEST_INSTANT.isoformat()}"
        )
    return instant


def args_json(id_: str, args: object) -> str:
    """``args`` as the JSON text stored, or refused: not a dict, not JSON, too large, or
    not what a round would read back."""
    if not isinstance(args, dict):
        raise RegistrationError(f"schedule {id_!r}: args must be a dict, got {type(args).__name__}")
    try:
        text = json.dumps(args, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        same = json.loads(text) == args  # recursion-bound too
    except (TypeError, ValueError) as exc:
        raise RegistrationError(f"schedule {id_!r}: args are not JSON: {exc}") from exc
    except RecursionError as exc:  # nested deeper than the interpreter recurses
        raise RegistrationError(
            f"schedule {id_!r}: args are nested too deep to encode as JSON"
        ) from exc
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_ARGS_BYTES:
        raise RegistrationError(
            f"schedule {id_!r}: args take {size} bytes as JSON; the limit is {MAX_ARGS_BYTES}"
        )
    problem = lease.unstorable(text)
    if problem is not None:
        raise RegistrationError(f"schedule {id_!r}: args {problem}")
    if not same:
        # json.dumps turns keys 1 and None into "1" and "null", tuples into lists: the
        # round would see other args than were given.
        raise RegistrationError(
            f"schedule {id_!r}: args would change through JSON (keys must be strings, "
            "sequences lists): give them as the round is to see them"
        )
    return text


def _named(id_: object) -> str:
    try:
        _check_name(id_)
    except RegistrationError as exc:
        message = str(exc).replace("job name", "schedule id", 1)
        message = message.replace("a job needs a name", "a schedule needs an id", 1)
        raise RegistrationError(message) from exc
    assert isinstance(id_, str)
    return id_


def checked(new: New, *, registry: Registry | None = None) -> lease.ScheduleRow:
    """``new`` as the row to write, every value checked.

    Raises:
        RegistrationError: a bad id or task name, a task ``registry`` does not hold, args
            that are not a JSON object or take over `MAX_ARGS_BYTES`.
        ScheduleError: neither or both of ``spec`` and ``at``; a spec that does not parse,
            names a refused zone, or fires at no instant within ``start`` and ``end``; a
            naive datetime; ``end`` before ``start``.
        RegistrationError: a policy registration would refuse (see
            `cronjob.schedules._policies.policies_json`).
    """
    id_ = _named(new.id)
    if not isinstance(new.task, str):
        raise RegistrationError(f"schedule {id_!r}: task must be a string, got {new.task!r}")
    try:
        _check_name(new.task)
    except RegistrationError as exc:
        raise RegistrationError(f"schedule {id_!r}: {exc}") from exc
    if registry is not None and new.task not in {task.name for task in registry.tasks}:
        raise RegistrationError(f"schedule {id_!r}: no task {new.task!r} is registered")
    if not isinstance(new.paused, bool):
        raise RegistrationError(f"schedule {id_!r}: paused must be True or False")
    if (new.spec is None) == (new.at is None):
        raise ScheduleError(f"schedule {id_!r}: give exactly one of spec= and at=")
    at = _aware(id_, "at", new.at)
    start, end = _aware(id_, "start", new.start), _aware(id_, "end", new.end)
    if start is not None and end is not None and end < start:
        raise ScheduleError(
            f"schedule {id_!r}: end {end.isoformat()} comes before start {start.isoformat()}"
        )
    # Stored in whole seconds, as every instant is: the start rounded up and the end down,
    # so that the row read back admits no instant refused here.
    if start is not None and start.microsecond:
        start = start.replace(microsecond=0) + timedelta(seconds=1)
    if end is not None:
        end = end.replace(microsecond=0)
    if at is not None:
        at = at.replace(microsecond=0)
    if new.spec is not None and not isinstance(new.spec, str):
        raise ScheduleError(f"schedule {id_!r}: spec must be a string, got {new.spec!r}")
    try:
        schedule = timing(new.spec, at, start, end)
    except ScheduleError as exc:
        raise ScheduleError(f"schedule {id_!r}: {exc}") from exc
    if at is not None and ((start is not None and at < start) or (end is not None and at > end)):
        raise ScheduleError(f"schedule {id_!r}: at {at.isoformat()} lies outside start and end")
    if at is None and start is not None and schedule.next(start - _TICK) is None:
        raise ScheduleError(f"schedule {id_!r}: spec {new.spec!r} never fires within start and end")
    if at is None and start is None and end is not None and schedule.prev(end + _TICK) is None:
        raise ScheduleError(f"schedule {id_!r}: spec {new.spec!r} never fires before end")
    policies = policies_json(id_, {key: getattr(new, key) for key in OWN_POLICIES})
    return lease.ScheduleRow(
        id=id_,
        task=new.task,
        spec=new.spec,
        at=at,
        args=args_json(id_, new.args),
        start=start,
        end=end,
        rev=0,
        removed=False,
        created=_EPOCH,  # the database's clock decides both as it writes
        updated=_EPOCH,
        # A row with policies of its own in the format that carries them: a replica of a
        # release before them leaves it alone rather than run it without them. One
        # without stays format 1, which every release since 0008 runs.
        format=1 if policies is None else lease.POLICIES_FORMAT,
        policies=policies,
    )


def check(
    id: str,
    *,
    task: str,
    spec: str | None = None,
    at: datetime | None = None,
    args: dict[str, Any] | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    registry: Registry | None = None,
    overlap: Overlap | str | None = None,
    catch_up: CatchUp | str | None = None,
    catch_up_window: float | timedelta | None = None,
    jitter: float | timedelta | None = None,
    heartbeat: str | None = None,
) -> None:
    """Refuse the schedule [add][cronjob.schedules.add] would refuse for its values,
    writing nothing and reading no database: for a form's ``clean()``, before the
    schedule is added or updated.

    What needs the database is left to ``add``: an id already taken by a schedule or a
    job, and the database's own failures. Every argument is as for
    [add][cronjob.schedules.add] (``id``, ``task``, ``spec`` or ``at``, ``args``,
    ``start``, ``end``, ``registry``, and the schedule's own policies).

    Raises:
        RegistrationError: a bad id, task name or args, a task ``registry`` does not
            hold, a policy registration would refuse (a `ValueError`).
        ScheduleError: a bad or never-firing spec, a naive datetime, ``end`` before
            ``start``, neither or both of ``spec`` and ``at`` (a `ValueError`).
    """
    checked(
        New(
            id,
            task,
            spec,
            at,
            {} if args is None else args,
            start,
            end,
            overlap=overlap,
            catch_up=catch_up,
            catch_up_window=catch_up_window,
            jitter=jitter,
            heartbeat=heartbeat,
        ),
        registry=registry,
    )
