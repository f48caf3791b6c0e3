"""The cells the ``cronjob`` tables and the status page share: times, durations, a job's
state and last round, an operator's text on one line."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Final

from .. import admin

#: The widest a pause reason is shown in the table (``--json`` has it whole).
REASON_WIDTH: Final = 40


def _why(record: admin.RoundRecord) -> str:
    """``manual (WHO)`` for a manual round; the reason otherwise."""
    if record.requested_by is None:
        return str(record.why)
    return f"{record.why} ({_cell(record.requested_by)})"


def _state(job: admin.JobStatus, *, pause_detail: bool = True) -> str:
    """The job's state in one cell: what it is doing, its pause, the rounds asked of it.

    With ``pause_detail=False`` (the ``cronjob status`` table) a pause is the one word
    ``paused``: who, since when and why go in a table of their own (``_pause_row``),
    so a paused job does not make its STATE cell a hundred characters wide.
    """
    return "; ".join(part for part in (_activity(job, pause_detail), _asked(job)) if part)


def _activity(job: admin.JobStatus, pause_detail: bool = True) -> str:
    paused = _paused(job) if pause_detail or job.paused_since is None else "paused"
    if job.per_instance:
        return "per instance" if paused is None else f"per instance, {paused}"
    if job.activity is admin.Activity.RUNNING:
        since = job.running_since.strftime("%H:%M:%S") if job.running_since else "?"
        running = f"running on {_cell(job.running_on or '?')} since {since}"
        return running if paused is None else f"{running}; {paused}"
    return str(job.activity) if paused is None else paused


def _asked(job: admin.JobStatus) -> str:
    """``round now asked by WHO at TIME (pending)``, one per open request."""
    asked = [
        f"round now asked by {_cell(r.requested_by)} at {r.requested:%H:%M:%S} ({r.state})"
        for r in job.requests
    ]
    if job.backfill_queued or job.backfilling is not None or job.backfill_cancelled:
        asked.append(_backfill(job))
    return "; ".join(asked)


def _backfill(job: admin.JobStatus) -> str:
    """``backfill: N instant(s) queued, running TIME``, then ``cancelled by WHO at TIME
    (N instant(s) not run)`` after a cancellation of the last day."""
    said = []
    if job.backfill_queued or job.backfilling is not None:
        running = "" if job.backfilling is None else f", running {_time(job.backfilling)}"
        said.append(f"{job.backfill_queued} instant(s) queued{running}")
    if job.backfill_cancelled is not None:
        said.append(
            f"cancelled by {_cell(job.backfill_cancelled_by or '?')} at "
            f"{_time(job.backfill_cancelled)} ({job.backfill_cancelled_instants} instant(s) "
            "not run)"
        )
    return "backfill: " + "; ".join(said)


def _paused(job: admin.JobStatus) -> str | None:
    """``paused by WHO since TIME (REASON)``, or ``None``: not paused."""
    if job.paused_since is None:
        return None
    reason = f" ({_cell(job.pause_reason, REASON_WIDTH)})" if job.pause_reason else ""
    return f"paused by {_cell(job.paused_by or '?')} since {_time(job.paused_since)}{reason}"


def _pause_row(job: admin.JobStatus) -> list[str] | None:
    """``[JOB, BY, SINCE, REASON]`` of a paused job for the table of pauses (the reason
    cut to `REASON_WIDTH`); ``None``: not paused."""
    if job.paused_since is None:
        return None
    reason = _cell(job.pause_reason, REASON_WIDTH) if job.pause_reason else "-"
    return [_cell(job.name), _cell(job.paused_by or "?"), _time(job.paused_since), reason]


def _ack_row(job: admin.JobStatus) -> list[str] | None:
    """``[JOB, INSTANTS, UP TO, BY, AT, REASON]`` of a job whose missed instants were
    acknowledged, for the table of acknowledgements; ``None``: none."""
    ack = job.acknowledgement
    if ack is None:
        return None
    reason = _cell(ack.reason, REASON_WIDTH) if ack.reason else "-"
    return [
        _cell(job.name),
        str(job.missed_acknowledged),
        _time(ack.through),
        _cell(ack.by or "?"),
        _time(ack.at),
        reason,
    ]


def _acknowledged(ack: admin.Acknowledgement) -> str:
    """``acknowledged up to T by WHO at T (REASON)``, on one line."""
    reason = f" ({_cell(ack.reason)})" if ack.reason else ""
    return (
        f"acknowledged up to {_time(ack.through)} UTC by {_cell(ack.by or '?')} at "
        f"{_time(ack.at)}{reason}"
    )


def _last(job: admin.JobStatus) -> str:
    if job.last_outcome is None:
        return "-"
    return f"{job.last_outcome} {_time(job.last_end)}"


def _time(when: datetime | None) -> str:
    return "-" if when is None else when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _duration(span: timedelta | None) -> str:
    if span is None:
        return "-"
    seconds = span.total_seconds()
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return (f"{hours}h" if hours else "") + f"{minutes}m{rest:02d}s"


def _cell(text: str, width: int | None = None) -> str:
    """``text`` on one line: control characters escaped, cut to ``width`` (marked)."""
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if width is not None and len(shown) > width:
        shown = shown[: width - 3] + "..."
    return shown
