"""Job policies: what a job's registration asks of its rounds beyond the schedule.

Every option is keyword-only on [register][cronjob.register],
[register_per_instance][cronjob.register_per_instance] and their decorator forms, and
validated there: a value that cannot be honoured fails the import, naming the job. Without
options a job keeps the seed's behaviour exactly (no timeout, no retry, no start deadline,
no self-pause, no hook).
"""

from __future__ import annotations

import enum
import math
import numbers
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, Literal, TypedDict, TypeVar

from ._exceptions import RegistrationError

if TYPE_CHECKING:
    from ._records import RoundRecord

__all__ = [
    "DEFAULT_CATCH_UP_WINDOW",
    "DEFAULT_POLICY",
    "DEFAULT_RETRY_BACKOFF",
    "MAX_DURATION",
    "RETRY_BACKOFF_CAP",
    "CatchUp",
    "FailureHook",
    "Overlap",
    "SuccessHook",
    "Policy",
    "PolicyOptions",
    "check_hook",
    "make_policy",
    "policy_text",
]

#: The first delay before a retry when ``retry_backoff`` is not given (seconds).
DEFAULT_RETRY_BACKOFF: Final = 10.0
#: The longest delay between two attempts, however many came before (seconds).
RETRY_BACKOFF_CAP: Final = 600.0

#: Called once per round that failed, timed out or missed its start deadline, with the
#: round's record, on a thread of its own (not a worker's); what it raises is logged.
FailureHook = Callable[["RoundRecord"], object]
#: Called once per round that succeeded, with the round's record, on the same thread as
#: the failure hooks; what it raises is logged.
SuccessHook = Callable[["RoundRecord"], object]

Seconds = float | int | timedelta

#: How far back catch-up looks when ``catch_up_window`` is not given: one day.
DEFAULT_CATCH_UP_WINDOW: Final = timedelta(days=1)
#: The longest duration an option may hold: 100 years. The scheduler adds durations to
#: instants and takes them from instants; one longer than this could leave `datetime`'s
#: range (years 1 to 9999), and is "never" or a mistake either way.
MAX_DURATION: Final = timedelta(days=36_500)


class Overlap(enum.StrEnum):
    """What an instant that falls while a round of its job runs does (``overlap=``)."""

    #: It is skipped, on record as overrun (the seed's rule).
    SKIP = "skip"
    #: The first such instant waits, at most one, and starts as the round ends.
    BUFFER_ONE = "buffer_one"
    #: It cancels the running round ([Superseded][cronjob.Superseded]) and starts once
    #: that round has ended (the latest such instant, if more came meanwhile).
    CANCEL_OTHER = "cancel_other"


class CatchUp(enum.StrEnum):
    """Which missed instants (no replica ran them) a job runs late (``catch_up=``)."""

    #: The latest one within the window, once (the seed's rule).
    LATEST = "latest"
    #: None: the job waits for its next instant.
    NONE = "none"
    #: Every one within the window, oldest first, one at a time, each on record.
    ALL = "all"
    #: The oldest one within the window, once; then the next instant to come (the
    #: Cyclone peer's rule: the first slot a schedule missed is the one its work is for).
    OLDEST = "oldest"


class PolicyOptions(TypedDict, total=False):
    """The keyword options of a registration that make its [Policy][cronjob.Policy]."""

    #: Cancel a round (``cronjob.TimedOut``) still running this long after it started.
    timeout: Seconds | None
    #: Run a round whose job raised its own error again, up to this many more times.
    retries: int
    #: The delay before the first retry; each next one doubles, capped, with full jitter.
    retry_backoff: Seconds
    #: A round that cannot start this long after its instant is not run (``missed_deadline``).
    start_deadline: Seconds | None
    #: After this many failed rounds in a row the job pauses itself cluster-wide.
    pause_after_failures: int | None
    #: Told of every failed, timed-out or deadline-missed round (see `FailureHook`).
    on_failure: FailureHook | None
    #: ``"process"``: each round runs in a child process, which a timeout or a lost
    #: lease ends (SIGTERM, then SIGKILL) while the replica lives on; ``"thread"``: the
    #: default, on a worker thread (or the loop).
    isolation: Literal["thread", "process"]
    #: An instant that falls while a round runs: ``"skip"``, ``"buffer_one"`` or
    #: ``"cancel_other"`` (see `Overlap`).
    overlap: Overlap | str
    #: The missed instants run late: ``"latest"``, ``"none"``, ``"all"`` or ``"oldest"``
    #: (see `CatchUp`).
    catch_up: CatchUp | str
    #: How far back catch-up looks (default one day).
    catch_up_window: Seconds
    #: Told of every round that succeeded (see `SuccessHook`).
    on_success: SuccessHook | None
    #: A Healthchecks-style URL pinged as each round starts, succeeds or fails.
    heartbeat: str | None
    #: Each round starts after a delay below this, drawn from a hash of (name, instant).
    jitter: Seconds | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """What a job asks of its rounds; the defaults keep the seed's behaviour.

    Attributes:
        timeout: A round (each attempt) still running this long after it started is
            cancelled with [TimedOut][cronjob.TimedOut]; ``None``: never.
        retries: How many more attempts a round whose job raised its own error (or
            [Retry][cronjob.Retry]) gets, for the same instant; 0: none.
        retry_backoff: The delay before the first retry; the n-th waits a uniformly
            random time up to ``retry_backoff * 2**(n-1)``, capped at
            `RETRY_BACKOFF_CAP` (full jitter).
        start_deadline: A round that cannot start this long after its instant is not
            run and is recorded ``missed_deadline``; ``None``: a late round still runs.
        pause_after_failures: After this many rounds in a row failed (retries spent),
            the job pauses itself on every replica; ``None``: never. Leased jobs only.
        on_failure: The job's own `FailureHook`; ``None``: the registry's, if any.
        isolation: ``"process"``: each round runs in a child process of its own (see
            `cronjob.engine._isolated`); ``"thread"``: on a worker thread or the loop.
        overlap: What an instant that falls while a round of the job runs (on any
            replica) does: skipped (`Overlap.SKIP`), buffered, at most one
            (`Overlap.BUFFER_ONE`), or it cancels the running round and starts once that
            has ended (`Overlap.CANCEL_OTHER`). No two rounds of a job run at once.
        catch_up: Which instants no replica ran (all down, the database out) run late:
            the latest (`CatchUp.LATEST`), none, all oldest first (`CatchUp.ALL`), or the
            oldest alone (`CatchUp.OLDEST`).
        catch_up_window: Only instants at most this old are caught up.
        on_success: The job's `SuccessHook`; ``None``: none.
        heartbeat: An ``http(s)`` URL pinged on the hooks thread (bounded to 5 s): with
            ``/start`` appended as a round starts, as is when it succeeds, with
            ``/fail`` when it fails, times out or misses its start deadline
            (Healthchecks.io); a URL with a ``status`` query parameter (Sentry Crons'
            check-in URL) gets ``status=in_progress``, ``ok`` or ``error`` instead.
            ``None``: no pings.
        jitter: Each round starts after a delay drawn from a hash of the job's name and
            the instant (`cronjob._jitter.jitter_delay`): the same on every replica
            and after every restart, below ``jitter`` and below the gap to the job's
            next instant; ``ctx.instant`` stays the nominal instant. ``None``: none.
    """

    timeout: timedelta | None = None
    retries: int = 0
    retry_backoff: timedelta = timedelta(seconds=DEFAULT_RETRY_BACKOFF)
    start_deadline: timedelta | None = None
    pause_after_failures: int | None = None
    on_failure: FailureHook | None = None
    isolation: Literal["thread", "process"] = "thread"
    overlap: Overlap = Overlap.SKIP
    catch_up: CatchUp = CatchUp.LATEST
    catch_up_window: timedelta = DEFAULT_CATCH_UP_WINDOW
    on_success: SuccessHook | None = None
    heartbeat: str | None = None
    jitter: timedelta | None = None

    @property
    def isolated(self) -> bool:
        """The rounds run in a child process (``isolation="process"``)."""
        return self.isolation == "process"

    @property
    def is_default(self) -> bool:
        """No option differs from the seed's behaviour (the hook aside)."""
        return not self.acts_on_rounds and self.pause_after_failures is None

    @property
    def acts_on_rounds(self) -> bool:
        """A timeout, retries or a start deadline is set: the engine times, retries or
        checks this job's rounds (the self-pause and the hook act on their ends only)."""
        return self.timeout is not None or self.retries > 0 or self.start_deadline is not None

    def describe(self) -> dict[str, Any]:
        """The options that differ from the defaults, as JSON-ready values (seconds).

        What the replicas' record carries, and what ``cronjob next``, ``cronjob status``
        and the page show. The hook is named (``module.qualname``), never called.
        """
        described: dict[str, Any] = {}
        if self.timeout is not None:
            described["timeout"] = self.timeout.total_seconds()
        if self.retries:
            described["retries"] = self.retries
            described["retry_backoff"] = self.retry_backoff.total_seconds()
        if self.start_deadline is not None:
            described["start_deadline"] = self.start_deadline.total_seconds()
        if self.pause_after_failures is not None:
            described["pause_after_failures"] = self.pause_after_failures
        if self.on_failure is not None:
            fn = self.on_failure
            module = getattr(fn, "__module__", None) or "?"
            described["on_failure"] = f"{module}.{getattr(fn, '__qualname__', repr(fn))}"
        if self.isolated:
            described["isolation"] = self.isolation

        if self.overlap is not Overlap.SKIP:
            described["overlap"] = self.overlap.value
        if self.catch_up is not CatchUp.LATEST:
            described["catch_up"] = self.catch_up.value
        if self.catch_up_window != DEFAULT_CATCH_UP_WINDOW:
            described["catch_up_window"] = self.catch_up_window.total_seconds()
        if self.on_success is not None:
            fn = self.on_success
            module = getattr(fn, "__module__", None) or "?"
            described["on_success"] = f"{module}.{getattr(fn, '__qualname__', repr(fn))}"
        if self.heartbeat is not None:
            # The host only: the path of a ping URL is its check's key (anyone holding it
            # can ping), and the record is read by every operator.
            described["heartbeat"] = urllib.parse.urlsplit(self.heartbeat).hostname or "?"
        if self.jitter is not None:
            described["jitter"] = self.jitter.total_seconds()
        return described


#: The policy of a job registered without options: the seed's behaviour. Every such job
#: shares this one (it is immutable).
DEFAULT_POLICY: Final = Policy()


def policy_text(described: Mapping[str, object]) -> str:
    """One line for people of a [Policy.describe][cronjob.Policy.describe] mapping (as on record):
    ``timeout 30s, retries 3 (backoff 10s), start deadline 1m, pause after 3 failures,
    on failure app.page``; ``""`` for none. Keys this release does not know are shown
    as ``key value``, so a newer replica's options are never hidden."""
    parts: list[str] = []
    for key, value in described.items():
        if key == "timeout":
            parts.append(f"timeout {_span(value)}")
        elif key == "retries":
            backoff = described.get("retry_backoff")
            suffix = "" if backoff is None else f" (backoff {_span(backoff)})"
            parts.append(f"retries {value}{suffix}")
        elif key == "retry_backoff":
            continue  # with the retries
        elif key == "start_deadline":
            parts.append(f"start deadline {_span(value)}")
        elif key == "pause_after_failures":
            parts.append(f"pause after {value} failures")
        elif key == "on_failure":
            parts.append(f"on failure {value}")
        elif key == "isolation":
            parts.append(f"isolation {value}")
        elif key == "overlap":
            parts.append(f"overlap {value}")
        elif key == "catch_up":
            window = described.get("catch_up_window")
            suffix = "" if window is None else f" within {_span(window)}"
            parts.append(f"catch-up {value}{suffix}")
        elif key == "catch_up_window":
            if "catch_up" not in described:  # else with the catch-up
                parts.append(f"catch-up within {_span(value)}")
        elif key == "on_success":
            parts.append(f"on success {value}")
        elif key == "heartbeat":
            parts.append(f"heartbeat to {value}")
        elif key == "jitter":
            parts.append(f"jitter {_span(value)}")
        else:
            parts.append(f"{key} {value}")
    return ", ".join(parts)


def _span(seconds: object) -> str:
    """``90`` -> ``1m30s``, ``0.5`` -> ``0.5s``: a duration in seconds, short."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return str(seconds)
    if not math.isfinite(seconds) or seconds < 60 or seconds != int(seconds):
        return f"{seconds:g}s"
    whole, parts = int(seconds), []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, whole = divmod(whole, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def make_policy(name: str, *, leased: bool, options: PolicyOptions) -> Policy:
    """Validate a registration's ``options`` for job ``name`` and return its policy.

    Raises:
        RegistrationError: an unknown option, or a value that cannot be honoured: a
            duration that is not a positive finite number of seconds or a positive
            ``timedelta``, or one longer than `MAX_DURATION`; ``retries`` not a whole
            number ≥ 0; ``pause_after_failures`` not a whole number ≥ 1, or given for a
            per-instance job (it has no state shared by the replicas to pause);
            ``on_failure`` or ``on_success`` not callable; ``isolation`` neither
            ``"thread"`` nor ``"process"``; ``overlap`` or ``catch_up`` not one of its
            values (a string or the member of `Overlap`, `CatchUp`); ``catch_up`` or
            ``catch_up_window`` given for a per-instance job (it keeps no record of the
            instants it missed); ``heartbeat`` not an ``http`` or ``https`` URL with a
            host and a port within 0-65535.
    """
    unknown = sorted(set(options) - set(PolicyOptions.__annotations__))
    if unknown:
        raise RegistrationError(
            f"job {name!r}: unknown option(s) {', '.join(unknown)}; a job's options are "
            f"{', '.join(PolicyOptions.__annotations__)}"
        )
    timeout = _duration(name, "timeout", options.get("timeout"))
    start_deadline = _duration(name, "start_deadline", options.get("start_deadline"))
    backoff = _duration(name, "retry_backoff", options.get("retry_backoff"))
    retries = _count(name, "retries", options.get("retries"), low=0) or 0
    pause = _count(name, "pause_after_failures", options.get("pause_after_failures"), low=1)
    if pause is not None and not leased:
        raise RegistrationError(
            f"job {name!r}: pause_after_failures is for leased jobs; a per-instance job "
            "has no state shared by the replicas to pause"
        )
    hook = options.get("on_failure")
    if hook is not None and not callable(hook):
        raise RegistrationError(f"job {name!r}: on_failure must be callable, got {hook!r}")
    isolation = options.get("isolation", "thread")
    if isolation not in ("thread", "process"):
        raise RegistrationError(
            f"job {name!r}: isolation must be 'thread' or 'process', got {isolation!r}"
        )
    overlap = _choice(name, "overlap", options.get("overlap"), Overlap)
    catch_up = _choice(name, "catch_up", options.get("catch_up"), CatchUp)
    window = _duration(name, "catch_up_window", options.get("catch_up_window"))
    if (catch_up is not None or window is not None) and not leased:
        raise RegistrationError(
            f"job {name!r}: catch_up and catch_up_window are for leased jobs; a "
            "per-instance job keeps no record of the instants it missed"
        )
    on_success = options.get("on_success")
    if on_success is not None and not callable(on_success):
        raise RegistrationError(f"job {name!r}: on_success must be callable, got {on_success!r}")
    heartbeat = _heartbeat(name, options.get("heartbeat"))
    jitter = _duration(name, "jitter", options.get("jitter"))
    if (
        timeout is None
        and start_deadline is None
        and backoff is None
        and not retries
        and pause is None
        and hook is None
        and isolation == "thread"
        and overlap is None
        and catch_up is None
        and window is None
        and on_success is None
        and heartbeat is None
        and jitter is None
    ):
        # No option: the one default policy, shared (a replica of 100,000 jobs would
        # otherwise keep 100,000 equal ones, ~120 bytes each).
        return DEFAULT_POLICY
    return Policy(
        timeout=timeout,
        retries=retries,
        retry_backoff=backoff or timedelta(seconds=DEFAULT_RETRY_BACKOFF),
        start_deadline=start_deadline,
        pause_after_failures=pause,
        on_failure=hook,
        isolation=isolation,
        overlap=overlap or Overlap.SKIP,
        catch_up=catch_up or CatchUp.LATEST,
        catch_up_window=window or DEFAULT_CATCH_UP_WINDOW,
        on_success=on_success,
        heartbeat=heartbeat,
        jitter=jitter,
    )


def check_hook(hook: object) -> FailureHook | None:
    """Return a registry-wide ``on_failure`` hook, refusing one that is not callable."""
    if hook is not None and not callable(hook):
        raise RegistrationError(f"Registry(on_failure=...) must be callable, got {hook!r}")
    return hook


def _duration(name: str, option: str, value: object) -> timedelta | None:
    """A positive duration from seconds or a ``timedelta``, at most `MAX_DURATION`;
    ``None`` stays ``None``."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:  # an int past float's range: longer than any limit
            seconds = float(MAX_DURATION.days * 86_400 + 1)
    else:
        raise RegistrationError(
            f"job {name!r}: {option} must be seconds (a number) or a timedelta, got {value!r}"
        )
    if not math.isfinite(seconds) or seconds <= 0:
        raise RegistrationError(f"job {name!r}: {option} must be positive, got {value!r}")
    if seconds > MAX_DURATION.total_seconds():
        # Checked before timedelta(seconds=...), which overflows past 999,999,999 days.
        raise RegistrationError(
            f"job {name!r}: {option} must be at most {MAX_DURATION.days} days "
            f"(100 years), got {value!r}"
        )
    return value if isinstance(value, timedelta) else timedelta(seconds=seconds)


def _count(name: str, option: str, value: object, *, low: int) -> int | None:
    """A whole number at least ``low``; ``None`` stays ``None``."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise RegistrationError(f"job {name!r}: {option} must be a whole number, got {value!r}")
    if value < low:
        raise RegistrationError(f"job {name!r}: {option} must be at least {low}, got {value!r}")
    return value


_E = TypeVar("_E", bound=enum.StrEnum)


def _choice(name: str, option: str, value: object, kind: type[_E]) -> _E | None:
    """One of ``kind``'s values, as a member or its string; ``None`` stays ``None``."""
    if value is None:
        return None
    if isinstance(value, str):
        for member in kind:
            if member.value == value:
                return member
    choices = ", ".join(repr(member.value) for member in kind)
    raise RegistrationError(f"job {name!r}: {option} must be one of {choices}, got {value!r}")


def _heartbeat(name: str, value: object) -> str | None:
    """An ``http`` or ``https`` URL with a host; ``None`` stays ``None``."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise RegistrationError(f"job {name!r}: heartbeat must be a URL (a str), got {value!r}")
    try:
        parts = urllib.parse.urlsplit(value)
        host = parts.hostname
        _ = parts.port  # a port past 65535 is refused now, not at the first ping
    except ValueError as exc:  # a malformed port, an unbalanced bracket
        raise RegistrationError(f"job {name!r}: heartbeat {value!r} is not a URL: {exc}") from exc
    if parts.scheme not in ("http", "https") or not host:
        raise RegistrationError(
            f"job {name!r}: heartbeat must be an http or https URL with a host, got {value!r}"
        )
    return value
