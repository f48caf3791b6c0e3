"""What the scheduler did, as OpenTelemetry metrics (the API only; configure any SDK).

The instruments, made once per scheduler from its meter provider (OpenTelemetry's global
one by default, whose instruments do nothing until an SDK is configured):

============================  ===============  =============  ==========================
name                          instrument       unit           attributes
============================  ===============  =============  ==========================
``cronjob.rounds``            counter          ``{round}``    job, outcome, ``error.type``
``cronjob.round.duration``    histogram        ``s``          job, outcome
``cronjob.round.lateness``    histogram        ``s``          job, reason
``cronjob.round.active``      up-down counter  ``{round}``    job
``cronjob.reruns``            counter          ``{round}``    job
``cronjob.catch_ups``         counter          ``{round}``    job, reason
``cronjob.lost_leases``       counter          ``{lease}``    job
``cronjob.skipped_instants``  counter          ``{instant}``  job, reason
``cronjob.instants.missed``   counter          ``{instant}``  job
``cronjob.outbox.published``  counter          ``{message}``  job, target
``cronjob.outbox.republished``  counter        ``{message}``  job, target
``cronjob.outbox.refused``    counter          ``{send}``     job, target
``cronjob.outbox.obsolete``   counter          ``{message}``  job, target
``cronjob.outbox.invalid``    counter          ``{message}``  job, target
``cronjob.outbox.latency``    histogram        ``s``          job, target
``cronjob.outbox.unsent``     gauge            ``{message}``  (none)
``cronjob.outbox.oldest_unsent_age``  gauge    ``s``          (none)
============================  ===============  =============  ==========================

Names follow OpenTelemetry's naming rules: a namespace of our own (``cronjob``), never
pluralized; counters of countable things pluralized, with a ``{annotation}`` unit and no
``total``; an up-down counter not pluralized (``.active``, like ``cicd.pipeline.run.active``);
durations in seconds (``s``). Attribute values are the ones spans and logs already use:
``cronjob.job`` is the job's name, ``cronjob.outcome`` one of ``succeeded``, ``failed``,
``cut short``, ``given up`` (a second round cut short), and with a job's policies
``timed_out``, ``retrying`` (an attempt followed by another) and ``missed_deadline`` (a
round not started: counted in ``cronjob.rounds`` only), ``cronjob.reason`` why a round
ran (``schedule``, ``catch-up``, ``catch-up after an outage``, ``re-run``, ``start-up``,
``retry``) or
why an instant was skipped (``overrun``, ``database unreachable``), and ``error.type`` on
a round that ended in error: the qualified class name of the job's exception for
``failed`` and ``retrying`` (an attempt that failed), ``timeout`` for ``timed_out``; a
round cut short or given up was cancelled, not in error, and has none.

The outbox's (`OutboxMeters`, ``Meters.outbox``): a hand-off's publications accepted by
the broker, the first time by the round's first run (``published``) or again with the
same id by the sweep or a second run (``republished``); sends refused; rows resolved
obsolete and rows found invalid by the sweep; the latency from the scheduled instant to
the broker's acceptance; and two gauges, the unsent publications (all jobs') and the age
of the oldest, as the sweep's latest read found them (a scrape reads no database).
``cronjob.target`` is the publisher's target (``rq``, ``celery``…).

Each part calls the `JobMetrics` of the job it handles (``state.metrics``) where
the event already happens: the runner as a round starts and ends, the keeper on a loss,
the sweeper on a second run, the dispatcher on a catch-up and on skipped instants. An
event builds its attribute set (a small dict) and costs a call into the API; with no
SDK, nothing more. Nothing is kept per job but its name: a replica keeps its jobs' metrics
for its whole life.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation

from .._round import Outcome
from ._committed import owed_from

if TYPE_CHECKING:
    from lease import LeaseRow

    from .._schedule import Schedule

__all__ = ["GIVEN_UP", "SKIP_COUNT_LIMIT", "JobMetrics", "Meters", "OutboxMeters"]

#: The ``cronjob.outcome`` of a round cut short on its second run (the instant is given up).
GIVEN_UP = "given up"
#: Overrun instants counted for one round at most (an ``@every 1s`` job stuck for a day
#: would otherwise cost the dispatcher 86,400 steps of its schedule).
SKIP_COUNT_LIMIT = 10_000

#: How far back a catch-up counts the instants it finds missed (the catch-up's day).
MISSED_HORIZON = timedelta(days=1)

#: Bucket boundaries, in seconds, for lateness: a few milliseconds to an hour (a catch-up).
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 15, 60, 300, 3600)
#: Bucket boundaries, in seconds, for durations: from 10 ms to a day.
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 86400)

Attributes = Mapping[str, str]


def _error_type(outcome: Outcome, error: BaseException | None) -> str | None:
    """The ``error.type`` of a round that ended with ``outcome``: the job's exception's
    qualified class name when the job's own error ended it (``failed``, ``retrying``),
    ``timeout`` when its job's timeout did; ``None`` otherwise (OpenTelemetry's rule:
    set on an operation that ended in error, and only there)."""
    if outcome is Outcome.TIMED_OUT:
        return "timeout"
    if outcome in (Outcome.FAILED, Outcome.RETRYING) and error is not None:
        kind = type(error)
        return f"{kind.__module__}.{kind.__qualname__}"
    return None


class Meters:
    """The scheduler's instruments, on the meter ``cronjob`` of ``meter_provider``.

    Args:
        meter_provider: Where the measurements go; ``None`` for OpenTelemetry's global
            provider (one configured after the scheduler starts is used from then on).
        version: The library's version, the meter's.
    """

    def __init__(self, meter_provider: MeterProvider | None = None, *, version: str = "") -> None:
        meter = metrics.get_meter("cronjob", version, meter_provider)
        self.rounds = meter.create_counter(
            "cronjob.rounds", "{round}", "Rounds that ended, by job and outcome."
        )
        self.duration = meter.create_histogram(
            "cronjob.round.duration",
            "s",
            "How long rounds ran, from the job's start to its end.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.lateness = meter.create_histogram(
            "cronjob.round.lateness",
            "s",
            "How long after its scheduled instant a round started.",
            explicit_bucket_boundaries_advisory=LATENESS_BUCKETS,
        )
        self.active = meter.create_up_down_counter(
            "cronjob.round.active", "{round}", "Rounds running now on this replica."
        )
        self.reruns = meter.create_counter(
            "cronjob.reruns", "{round}", "Second runs of rounds cut short, as they start."
        )
        self.catch_ups = meter.create_counter(
            "cronjob.catch_ups", "{round}", "Rounds owed after a start or an outage, as they start."
        )
        self.lost_leases = meter.create_counter(
            "cronjob.lost_leases", "{lease}", "Leases of running rounds found taken or expired."
        )
        self.skipped_instants = meter.create_counter(
            "cronjob.skipped_instants", "{instant}", "Instants of a job that did not run."
        )
        self.missed_instants = meter.create_counter(
            "cronjob.instants.missed",
            "{instant}",
            "Instants that no replica ran nor accounted for, found as a catch-up runs the latest.",
        )
        self.outbox = OutboxMeters(meter)

    def job(self, name: str) -> JobMetrics:
        """The measurements of the job named ``name``.

        Its count of successful rounds starts at 0 here, as the replica starts: an alert
        on "no successful round for a while" then sees a job that never succeeds, instead
        of a series that does not exist.
        """
        job = JobMetrics(self, name)
        self.rounds.add(0, job.by_outcome(Outcome.SUCCEEDED.text))
        return job


class OutboxMeters:
    """The outbox's instruments (see the module's table), on ``meter``.

    The counters and the histogram are called where the event happens (the round's
    thread, the ``cronjob-outbox`` thread); the gauges report what `read` was last told,
    from the scrape's thread, without a query.
    """

    def __init__(self, meter: Meter) -> None:
        self.published = meter.create_counter(
            "cronjob.outbox.published",
            "{message}",
            "Publications the broker accepted from the round's first run.",
        )
        self.republished = meter.create_counter(
            "cronjob.outbox.republished",
            "{message}",
            "Publications the broker accepted again with the same id: a sweep, a second run.",
        )
        self.refused = meter.create_counter(
            "cronjob.outbox.refused", "{send}", "Sends the broker refused or did not answer."
        )
        self.obsolete = meter.create_counter(
            "cronjob.outbox.obsolete",
            "{message}",
            "Unsent publications resolved obsolete: no replica registers their job any more.",
        )
        self.invalid = meter.create_counter(
            "cronjob.outbox.invalid",
            "{message}",
            "Unsent rows found undecodable or not their occurrence's id: kept, never sent.",
        )
        self.latency = meter.create_histogram(
            "cronjob.outbox.latency",
            "s",
            "From a publication's scheduled instant to the broker's acceptance.",
            explicit_bucket_boundaries_advisory=LATENESS_BUCKETS,
        )
        #: (unsent, when the oldest was recorded, when read), epoch ms; None: never read.
        self._seen: tuple[int, int | None, int] | None = None
        meter.create_observable_gauge(
            "cronjob.outbox.unsent",
            [self._unsent],
            "{message}",
            "Publications not yet accepted nor resolved, all jobs', at the latest sweep.",
        )
        meter.create_observable_gauge(
            "cronjob.outbox.oldest_unsent_age",
            [self._oldest_age],
            "s",
            "How long the oldest unsent publication had been on record at the latest sweep.",
        )

    def accepted(
        self, job: str, target: str, instant: datetime, at: datetime, *, again: bool
    ) -> None:
        """The broker accepted ``job``'s publication of ``instant`` at ``at``: the first
        time (``again`` false: a round's first run) or again with the same id."""
        attributes = {"cronjob.job": job, "cronjob.target": target}
        (self.republished if again else self.published).add(1, attributes)
        self.latency.record(max(0.0, (at - instant).total_seconds()), attributes)

    def note_refused(self, job: str, target: str) -> None:
        """A send of ``job``'s publication was refused, or not answered in time."""
        self.refused.add(1, {"cronjob.job": job, "cronjob.target": target})

    def note_obsolete(self, job: str, target: str) -> None:
        """An unsent publication of ``job`` was resolved obsolete."""
        self.obsolete.add(1, {"cronjob.job": job, "cronjob.target": target})

    def note_invalid(self, job: str, target: str) -> None:
        """An unsent row of ``job`` was found invalid (kept, put off, not sent)."""
        self.invalid.add(1, {"cronjob.job": job, "cronjob.target": target})

    def read(self, unsent: int, oldest_ms: int | None, now_ms: int) -> None:
        """A sweep read, at ``now_ms``, ``unsent`` publications, the oldest recorded at
        ``oldest_ms``: what the gauges report until the next one."""
        self._seen = (unsent, oldest_ms, now_ms)

    def _unsent(self, _options: CallbackOptions) -> Iterator[Observation]:
        seen = self._seen
        if seen is not None:
            yield Observation(seen[0])

    def _oldest_age(self, _options: CallbackOptions) -> Iterator[Observation]:
        seen = self._seen
        if seen is not None:
            unsent, oldest_ms, now_ms = seen
            age = 0 if oldest_ms is None or not unsent else max(0, now_ms - oldest_ms)
            yield Observation(age / 1000)


class JobMetrics:
    """One job's measurements.

    Called from the threads where the events happen (the API is thread-safe); it keeps no
    state of its own, and no attribute set either: each event builds its own (a dict of
    two entries, ~0.1 µs; an SDK's measurement costs microseconds). A replica keeps one
    per job for its whole life, and sets kept per job — the job's, an outcome's, a
    reason's — cost a replica of 100,000 jobs ~100 MB once every job had run a round.
    """

    __slots__ = ("_meters", "_name")

    def __init__(self, meters: Meters, name: str) -> None:
        self._meters = meters
        self._name = name

    def _with(self, key: str, value: str) -> Attributes:
        return {"cronjob.job": self._name, key: value}

    def by_outcome(self, outcome: str) -> Attributes:
        """The attributes of a round of this job that ended with ``outcome``."""
        return self._with("cronjob.outcome", outcome)

    def started(self, instant: datetime, now: datetime, reason: str) -> None:
        """A round of ``instant`` started at ``now`` (clock time), for ``reason``."""
        self._meters.active.add(1, {"cronjob.job": self._name})
        lateness = max(0.0, (now - instant).total_seconds())
        self._meters.lateness.record(lateness, self._with("cronjob.reason", reason))

    def ended(
        self, outcome: Outcome, error: BaseException | None, seconds: float, *, given_up: bool
    ) -> None:
        """A round that started ended with ``outcome`` after ``seconds``.

        ``given_up``: it was a second run and was cut short, so its instant is given up.
        """
        self._meters.active.add(-1, {"cronjob.job": self._name})
        value = GIVEN_UP if given_up and outcome is Outcome.CUT_SHORT else outcome.text
        attributes = self.by_outcome(value)
        self._meters.duration.record(max(0.0, seconds), attributes)
        kind = _error_type(outcome, error)
        if kind is not None:
            attributes = {**attributes, "error.type": kind}
        self._meters.rounds.add(1, attributes)

    def missed_deadline(self) -> None:
        """A round was not started: it could not start within its job's start deadline
        (counted in ``cronjob.rounds`` as ``missed_deadline``; it has no duration)."""
        self._meters.rounds.add(1, self.by_outcome(Outcome.MISSED_DEADLINE.text))

    def rerun(self) -> None:
        """A second run of a round cut short starts."""
        self._meters.reruns.add(1, {"cronjob.job": self._name})

    def caught_up(self, reason: str, *, missed: int = 0) -> None:
        """A round owed after start-up or an outage starts (``reason`` says which); the
        ``missed`` instants before it ran nowhere (see `missed_before`)."""
        self._meters.catch_ups.add(1, self._with("cronjob.reason", reason))
        self.missed(missed)

    def lost_lease(self) -> None:
        """The lease of a running round was found taken, or went too long unrenewed."""
        self._meters.lost_leases.add(1, {"cronjob.job": self._name})

    def skipped(self, count: int, reason: str) -> None:
        """``count`` instants did not run, for ``reason``."""
        if count > 0:
            self._meters.skipped_instants.add(count, self._with("cronjob.reason", reason))

    def missed(self, count: int) -> None:
        """``count`` instants before the one caught up ran nowhere (see `missed_before`)."""
        if count > 0:
            self._meters.missed_instants.add(count, {"cronjob.job": self._name})

    def published(self, target: str, instant: datetime, at: datetime, *, again: bool) -> None:
        """The broker accepted this job's publication of ``instant`` at ``at`` (see
        `OutboxMeters.accepted`)."""
        self._meters.outbox.accepted(self._name, target, instant, at, again=again)

    def refused(self, target: str) -> None:
        """A send of this job's publication was refused (or not answered in time)."""
        self._meters.outbox.note_refused(self._name, target)

    def overrun(self, schedule: Schedule, started: datetime, ended: datetime) -> None:
        """Count the instants that came due while a round ran, from ``started`` through
        ``ended``: the dispatcher schedules the job after ``ended``, so they are skipped
        (at most `SKIP_COUNT_LIMIT` counted)."""
        count, when = 0, schedule.next(started)
        while when is not None and when <= ended and count < SKIP_COUNT_LIMIT:
            count += 1
            when = schedule.next(when)
        self.skipped(count, "overrun")


def missed_before(schedule: Schedule, row: LeaseRow, instant: datetime, now: datetime) -> int:
    """The instants of ``schedule`` before ``instant`` (the one a catch-up claims) that no
    replica ran nor accounted for, as `cronjob.admin.JobStatus.missed` counts them: after
    the row's latest claim, its first deployment, its timing's latest change
    (``spec_changed``), the overrun it records (``skipped_through``) and a day before
    ``now``; at most `SKIP_COUNT_LIMIT`."""
    count, when = 0, schedule.next(catch_up_floor(row, now))
    while when is not None and when < instant and count < SKIP_COUNT_LIMIT:
        count += 1
        when = schedule.next(when)
    return count


def catch_up_floor(row: LeaseRow, now: datetime) -> datetime:
    """The moment after which a catch-up finds a job's instants missed: the row's latest
    claim, its first deployment (a schedule made of data: its commit, see
    `cronjob.engine._committed`), its timing's latest change (``spec_changed``), the
    overrun it records (``skipped_through``), and a day before ``now``, whichever is
    latest."""
    marks = (row.instant, owed_from(row), row.skipped_through, row.spec_changed)
    return max([at for at in marks if at is not None] + [now - MISSED_HORIZON])


#: Measurements that go nowhere: a job's state built without a scheduler (tests).
NO_METRICS = Meters(metrics.NoOpMeterProvider()).job("")
