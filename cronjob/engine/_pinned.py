"""The pinned round: what a claimed round runs, fixed as it is made from its claim.

A schedule made of data can change or go while its round runs (see
`cronjob.engine._data`, which replaces ``JobState.job``). A round already claimed never
follows: its `Pinned` descriptor — its name, task, args, instant, job (function or
publisher, schedule, policy) — is taken once, and its run, its retries, its second run
after it was cut short here, the instant buffered or superseding after it and a jittered
start read that descriptor, never the live ``JobState.job``. A change governs the
instants not yet claimed only.

`pin` is the one place a round's descriptor is chosen: a descriptor pinned before for that
very instant (a retry, a second run of a round cut short here, a jittered instant that came
before a change) if there is one, else the job as it is now.

Dispatcher thread only (a round's thread reads its own descriptor, which never changes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from .._jitter import jitter_delay
from .._policy import Policy
from .._registry import Job
from .._schedule import Schedule

__all__ = ["NO_LIMITS", "Limits", "Pinned"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """What a job's policy asks of each of its rounds, read once per change of the job
    (`JobState.refresh`) and shared by the descriptors of its rounds.

    Attributes:
        timeout: The policy's timeout in seconds; ``None``: none.
        start_deadline: The policy's start deadline; ``None``: none.
        policed: The policy times, retries or checks rounds (a timeout, retries or a
            start deadline): the one test a round of a job without options pays.
        isolated: The rounds run in a child process (``isolation="process"``).
    """

    timeout: float | None = None
    start_deadline: timedelta | None = None
    policed: bool = False
    isolated: bool = False

    @classmethod
    def of(cls, policy: Policy) -> Limits:
        """The limits ``policy`` sets."""
        return cls(
            timeout=None if policy.timeout is None else policy.timeout.total_seconds(),
            start_deadline=policy.start_deadline,
            policed=policy.acts_on_rounds,
            isolated=policy.isolated,
        )


#: A policy's limits when it sets none.
NO_LIMITS: Final = Limits()


@dataclass(frozen=True, slots=True, kw_only=True)
class Pinned:
    """One claimed round's execution descriptor (immutable, one per round: three fields,
    as a round of 100,000 at one instant builds one each on the dispatcher's thread).

    Attributes:
        job: The job as the round was claimed: its function (for a hand-off, the
            publisher), schedule, policy, and a schedule's task and args.
        instant: The round's instant.
        limits: What the job's policy asks of the round (see `Limits`).
    """

    job: Job
    instant: datetime
    limits: Limits

    @classmethod
    def of(cls, job: Job, instant: datetime) -> Pinned:
        """The descriptor of ``job``'s round of ``instant``, its policy read now."""
        return cls(job=job, instant=instant, limits=Limits.of(job.policy))

    @property
    def timeout(self) -> float | None:
        """The round's timeout in seconds; ``None``: none."""
        return self.limits.timeout

    @property
    def start_deadline(self) -> timedelta | None:
        """The round's start deadline; ``None``: none."""
        return self.limits.start_deadline

    @property
    def policed(self) -> bool:
        """The round is timed, retried or checked (see `Limits.policed`)."""
        return self.limits.policed

    @property
    def isolated(self) -> bool:
        """The round runs in a child process."""
        return self.limits.isolated

    @property
    def name(self) -> str:
        """The job's name or the schedule's id."""
        return self.job.name

    @property
    def task(self) -> str | None:
        """A schedule's task; ``None`` for a registered job."""
        return self.job.task

    @property
    def args(self) -> str | None:
        """A schedule's arguments (JSON text); ``None`` for a registered job."""
        return self.job.args

    @property
    def fn(self) -> Callable[..., Any]:
        """What runs: the job's function, or its publisher for a hand-off."""
        return self.job.fn

    @property
    def policy(self) -> Policy:
        """The policy every decision about the round reads."""
        return self.job.policy

    @property
    def schedule(self) -> Schedule:
        """The schedule the round was claimed under."""
        return self.job.schedule

    def starts_at(self) -> datetime:
        """When the round starts: its instant, or later by its jitter (see
        `cronjob.engine._state.JobState.starts_at`)."""
        jitter = self.job.policy.jitter
        if jitter is None:
            return self.instant
        following = self.job.schedule.next(self.instant)
        return self.instant + jitter_delay(self.job.name, self.instant, jitter, following)
