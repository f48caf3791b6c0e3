"""The wiring: the façade builds the parts here and hands each the ports it needs.

No part imports the part that calls it: the dispatcher is handed to the parts as the
`Timetable` port, the rounds in flight as the `Starter`, the claims as the `Claimer`
(see ``_ports``); the dispatcher and the rounds in flight get the parts they call. The
object graph has its circles (the claims start rounds, the rounds' ends claim the next
instant); the import graph has none.

Two steps, in the order a start needs them:

1. `wire_core`, before the first migration: the heap (`Dispatcher`), the peers, the
   claims and their give-backs, the rounds in flight, and recovery with the sweep
   (second runs, requests) and the wings (backfills, the outbox's republisher). Nothing
   here starts a thread.
2. `wire_rounds`, once the database was reached or its retry scheduled: the runner (its
   worker threads, its loop, its finisher), the keeper, the policies' timers, what
   follows a round's end, and the wing of the schedules made of data (when this replica
   registers tasks).

The wings are listed to the core in one list (recovery, the sweep and the rounds in flight
call them through `Wing`); a new capability is appended there, not branched into the
core's parts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import lease

from .._clock import Clock
from .._history import History
from .._registry import Job, Registry, Task
from ._backfill import BackfillTaker
from ._claiming import Claims
from ._control import Control, Inbox
from ._data import DataSchedules
from ._dispatcher import Dispatcher
from ._failures import Failures, Hooks, hooked
from ._giveback import GiveBacks
from ._inflight import InFlight
from ._keeper import LeaseKeeper
from ._metrics import Meters
from ._overlap import NextRounds
from ._peers import Peers
from ._policies import PolicyTimers
from ._record import replica_record
from ._recovery import Recovery
from ._republish import Republisher
from ._requests import Requests
from ._reruns import Reruns
from ._runner import RoundRunner
from ._state import Flags, JobState
from ._summary import RoundSummary
from ._sweep import Sweeper
from ._wings import Wing

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider
    from sqlalchemy import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["Core", "wire_core", "wire_rounds"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Core:
    """The parts `wire_core` built: what `wire_rounds` wires the rounds to."""

    dispatcher: Dispatcher
    recovery: Recovery
    claims: Claims
    inflight: InFlight
    give_backs: GiveBacks
    #: The wings, in the order the core calls them (the façade's list).
    wings: list[Wing]
    states: dict[str, JobState]
    meters: Meters
    clock: Clock
    store: lease.LeaseStore
    control: Control
    inbox: Inbox
    flags: Flags


def wire_core(
    *,
    clock: Clock,
    replica_id: str,
    jobs: Sequence[Job],
    tasks: Mapping[str, Task],
    store: lease.LeaseStore,
    flags: Flags,
    max_workers: int,
    meter_provider: MeterProvider | None,
    migrate: Callable[[], None],
    history: bool = True,
    describe_database: Callable[[], str],
) -> Core:
    """Build the inbox, the control thread's queue, the jobs' states, the heap, the
    claims, the rounds in flight, recovery, the sweep and the wings of backfills and the
    outbox. Starts no thread. ``history``: whether the round history is kept (the
    claims put the rounds they give up on record)."""
    inbox = Inbox(clock)
    control = Control(clock, inbox)
    from .._version import __version__

    meters = Meters(meter_provider, version=__version__)
    states = {job.name: JobState(job, metrics=meters.job(job.name)) for job in jobs}
    leased = {name: state.job.schedule.spec for name, state in states.items() if state.job.leased}
    peers = Peers(
        clock=clock,
        store=store,
        control=control,
        replica_id=replica_id,
        jobs=leased | dict.fromkeys(tasks, ""),
    )
    summary = RoundSummary(clock.monotonic())
    dispatcher = Dispatcher(clock=clock, states=states, inbox=inbox, flags=flags, summary=summary)
    inflight = InFlight(
        clock=clock,
        store=store,
        control=control,
        inbox=inbox,
        flags=flags,
        timetable=dispatcher,
        summary=dispatcher.summary,
    )
    give_backs = GiveBacks(store=store, control=control)
    claims = Claims(
        timetable=dispatcher,
        starter=inflight,
        runs=inflight.runs,
        max_workers=max_workers,
        give_backs=give_backs,
        clock=clock,
        replica_id=replica_id,
        store=store,
        control=control,
        flags=flags,
        peers=peers,
        history=history,
    )
    wings: list[Wing] = []
    requests = Requests(
        clock=clock,
        store=store,
        control=control,
        timetable=dispatcher,
        starter=inflight,
        claims=claims,
        states=states,
        replica_id=replica_id,
    )
    reruns = Reruns(
        clock=clock,
        store=store,
        control=control,
        timetable=dispatcher,
        starter=inflight,
        claims=claims,
        give_backs=give_backs,
        states=states,
        replica_id=replica_id,
    )
    policies = {name: task.policy.describe() for name, task in tasks.items()}
    sweeper = Sweeper(
        clock=clock,
        store=store,
        control=control,
        states=states,
        reruns=reruns,
        requests=requests,
        wings=wings,
        replica_id=replica_id,
        names=list(leased),
        post=inbox.post,
        replica=replica_record(replica_id, clock, states, policies),
    )
    recovery = Recovery(
        clock=clock,
        store=store,
        control=control,
        timetable=dispatcher,
        claims=claims,
        peers=peers,
        states=states,
        sweeper=sweeper,
        wings=wings,
        replica_id=replica_id,
        migrate=migrate,
        describe_database=describe_database,
    )
    # The claims tell recovery of an outage, and the sweep's row check of the names lost.
    claims.outage = recovery
    claims.missed = sweeper.claims_missed
    wings.append(
        BackfillTaker(
            clock=clock,
            store=store,
            control=control,
            timetable=dispatcher,
            starter=inflight,
            states=states,
            replica_id=replica_id,
            taking=requests.taking,
            give_up=requests.give_up,
            sweep_soon=sweeper.sweep_soon,
        )
    )
    republisher = Republisher(
        clock=clock, store=store, control=control, states=states, meters=meters
    )
    # The rows of this replica's tasks' schedules, removed ones included, are its to send.
    republisher.follow_tasks(tasks)
    wings.append(republisher)
    inflight.give_backs = give_backs
    inflight.wings = wings
    dispatcher.peers = peers
    dispatcher.claims = claims
    dispatcher.inflight = inflight
    dispatcher.runs = inflight.runs
    dispatcher.recovery = recovery
    return Core(
        dispatcher=dispatcher,
        recovery=recovery,
        claims=claims,
        inflight=inflight,
        give_backs=give_backs,
        wings=wings,
        states=states,
        meters=meters,
        clock=clock,
        store=store,
        control=control,
        inbox=inbox,
        flags=flags,
    )


def wire_rounds(
    core: Core,
    *,
    replica_id: str,
    registry: Registry,
    engine: Engine,
    tasks: Mapping[str, Task],
    max_workers: int,
    loop: asyncio.AbstractEventLoop | None,
    needs_loop: bool,
    tracer_provider: TracerProvider | None,
    async_engine: AsyncEngine | lease.LeaseError | None,
    owns_async_engine: bool,
    history: History | None,
    crash: Callable[[], None],
    on_fatal: Callable[[str], None],
    on_lost: Callable[[str, datetime, int], None],
    app: str = "",
) -> tuple[RoundRunner, Hooks | None]:
    """Build what runs the rounds (the failure policies, the runner, the keeper, the
    policies' timers, what follows an end) and the wing of the schedules made of data;
    returns the runner and the hooks' thread (``None``: no job has a hook)."""
    clock, store, control, flags = core.clock, core.store, core.control, core.flags
    dispatcher, inflight = core.dispatcher, core.inflight
    # The failure hooks' thread, only when some job has a hook (started on first use).
    hooks = Hooks() if hooked(registry) else None
    failures = Failures(
        store=store, registry=registry, replica_id=replica_id, hooks=hooks, history=history
    )
    runner = RoundRunner(
        clock=clock,
        replica_id=replica_id,
        engine=engine,
        store=store,
        flags=flags,
        ended=inflight.post_rounds_ended,
        max_workers=max_workers,
        loop=loop,
        needs_loop=needs_loop,
        tracer_provider=tracer_provider,
        async_engine=async_engine,
        owns_async_engine=owns_async_engine,
        history=history,
        started=inflight.post_round_started,
        failures=failures,
        app=app,
    )
    keeper = LeaseKeeper(
        clock=clock,
        store=store,
        control=control,
        replica_id=replica_id,
        flags=flags,
        cancel=runner.cancel,
        crash=crash,
        on_fatal=on_fatal,
        on_lost=on_lost,
    )
    policies = PolicyTimers(
        timetable=dispatcher,
        starter=inflight,
        cancel=runner.cancel,
        decided=runner.ends.decided,
        keeper=keeper,
        clock=clock,
        store=store,
        control=control,
        flags=flags,
    )
    next_rounds = NextRounds(
        timetable=dispatcher,
        starter=inflight,
        claims=core.claims,
        runs=inflight.runs,
        cancel=runner.cancel,
        clock=clock,
    )
    inflight.runner, inflight.keeper = runner, keeper
    inflight.policies, inflight.next_rounds = policies, next_rounds
    dispatcher.keeper, dispatcher.policies, dispatcher.next_rounds = keeper, policies, next_rounds
    if tasks:
        recovery = core.recovery
        data = DataSchedules(
            clock=clock,
            store=store,
            control=control,
            inbox=core.inbox,
            timetable=dispatcher,
            claims=core.claims,
            states=core.states,
            tasks=tasks,
            meters=core.meters,
            changed=recovery.leased_changed,
            retimed=next_rounds.retimed,
            late=recovery.catch_up_loaded,
        )
        # First: it loads before start-up's catch-up, and its polls come first each wake.
        core.wings.insert(0, data)
        failures.follow(data)
    return runner, hooks
