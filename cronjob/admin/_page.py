"""The status page's HTML: the jobs and replicas, one job's recent rounds, an error.

Pure functions from [cronjob.admin][]'s values to a whole document: server-rendered,
every value escaped with `html.escape` (an exception message holding markup shows
as text), one inline stylesheet, no script and no external asset, readable on a phone
(a viewport meta tag; on a narrow screen each table row becomes a card). Links are made
under ``prefix``, the path the application mounted the page at. Serving it is
[cronjob.web][]'s concern.
"""

from __future__ import annotations

import html
import shlex
from collections.abc import Iterable, Sequence
from datetime import datetime
from urllib.parse import quote

from .. import admin
from .._policy import policy_text
from ._format import _acknowledged, _backfill, _duration, _last, _state, _time

__all__ = ["error_page", "job_page", "jobs_page"]

#: Characters of an error shown in a table cell; the job's page shows it whole.
ERROR_CELL = 120

_STYLE = """
:root { color-scheme: light dark; --bad: #c62828; --ok: #2e7d32; --line: #8884; }
body { font: 15px/1.4 system-ui, sans-serif; margin: 0 auto; padding: 0 1rem 2rem;
       max-width: 80rem; }
h1 { font-size: 1.3rem; margin: 1rem 0 .2rem; } h1 a { color: inherit; }
h2 { font-size: 1.1rem; margin: 1.5rem 0 .5rem; }
.summary { margin: 0; } .bad { color: var(--bad); } .ok { color: var(--ok); }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; vertical-align: top; padding: .35rem .5rem;
         border-bottom: 1px solid var(--line); white-space: nowrap; }
th { font-weight: 600; } td.wrap { white-space: normal; overflow-wrap: anywhere; }
td.soft { white-space: normal; overflow-wrap: break-word; }
.scroll { overflow-x: auto; }
tr.problem td:first-child { border-left: 4px solid var(--bad); }
code { font-size: .9em; } dl { display: grid; grid-template-columns: max-content 1fr;
       gap: .2rem 1rem; } dt { font-weight: 600; } dd { margin: 0; overflow-wrap: anywhere; }
pre { white-space: pre-wrap; overflow-wrap: anywhere; margin: 0; }
@media (max-width: 40rem) {
  thead { display: none; }
  table, tbody, tr, td { display: block; width: auto; }
  tr { border: 1px solid var(--line); border-radius: .4rem; margin: 0 0 .6rem;
       padding: .3rem .5rem; }
  td { border: 0; padding: .15rem 0; white-space: normal; overflow-wrap: anywhere; }
  td::before { content: attr(data-label) ": "; font-weight: 600; }
  tr.problem td:first-child { border-left: 0; }
  tr.problem { border-left: 4px solid var(--bad); }
  dl { grid-template-columns: 1fr; } dd { margin-bottom: .4rem; }
}
"""


def e(value: object) -> str:
    """``value`` as text, escaped for HTML (quotes too: safe in attributes)."""
    return html.escape(str(value), quote=True)


def job_href(prefix: str, name: str, *, failed: bool = False) -> str:
    """The path of job ``name``'s page under ``prefix`` (the name percent-encoded)."""
    return f"{prefix}/job?name={quote(name, safe='')}" + ("&failed=1" if failed else "")


def _next(job: admin.JobStatus) -> str:
    """The next instant's cell: "paused" while no instant of the job runs."""
    return "paused" if job.paused else _time(job.next_instant)


def jobs_page(report: admin.Status, prefix: str) -> str:
    """The front page: every job on record, the problems, the retired jobs (apart), the
    live replicas."""
    problems = report.problems
    summary = (
        '<span class="ok">all jobs healthy</span>'
        if not problems
        else f'<span class="bad">{len(problems)} problem{_s(len(problems))}</span>'
    )
    retired = report.retired
    jobs = [job for job in report.jobs if job.activity is not admin.Activity.RETIRED]
    # A column of the jobs' policies only when some job has one; of their tasks, when
    # some job is a schedule made of data (its task is not its own name).
    policies = any(job.policies for job in jobs)
    tasks = any(job.task != job.name for job in jobs)
    rows = [
        _row(
            {
                "Job": f'<a href="{e(job_href(prefix, job.name))}">{e(job.name)}</a>',
            }
            | ({"Task": e(job.task)} if tasks else {})
            | {
                "Schedule": _spec(job),
                "Next (UTC)": e(_next(job)),
                "State": e(_state(job)),
                "Last": _outcome_text(job.last_outcome, _last(job)),
                "Duration": e(_duration(job.last_duration)),
                "Failures": e(job.consecutive_failures if not job.per_instance else "-"),
                "Missed": e(_missed(job)),
            }
            | ({"Policies": e(policy_text(job.policies) or "-")} if policies else {}),
            problem=bool(job.problems),
        )
        for job in jobs
    ]
    headers = ["Job", "Schedule", "Next (UTC)", "State", "Last", "Duration", "Failures", "Missed"]
    if tasks:
        headers.insert(1, "Task")
    if policies:
        headers.append("Policies")
    counted = f"{len(jobs)} job{_s(len(jobs))}"
    if retired:
        counted += f" (and {len(retired)} retired)"
    body = [
        f"<p class=summary>{counted}, {summary}; checked {e(_time(report.checked_at))} UTC</p>",
        "<h2>Jobs</h2>",
        _table(headers, rows, empty="No jobs on record."),
    ]
    if problems:
        body.append("<h2>Problems</h2>")
        body.append(_list(e(problem) for problem in problems))
    if retired:
        body.append("<h2>Retired jobs</h2>")
        body.append(
            "<p>On record, but no live replica registers them (renamed or removed from the "
            "code): nothing runs them, and they are never a problem. "
            "<code>cronjob forget NAME</code> deletes one's record.</p>"
        )
        body.append(_retired(retired, prefix))
    if report.outbox.unsent:
        oldest = report.outbox.oldest
        body.append("<h2>Outbox</h2>")
        body.append(
            f"<p>{report.outbox.unsent} occurrence(s) not yet accepted by their task queue; "
            f"the oldest recorded {e(oldest.isoformat() if oldest else '-')}.</p>"
        )
    body.append("<h2>Live replicas</h2>")
    body.append(_replicas(report.replicas))
    return _document("cronjob status", prefix, body)


def job_page(
    job: admin.JobStatus,
    rounds: Sequence[admin.RoundRecord],
    prefix: str,
    *,
    failed: bool,
    checked_at: datetime,
) -> str:
    """One job: its state on record, then its latest rounds (only failed ones if ``failed``)."""
    facts = {
        **({"Task": e(job.task)} if job.task != job.name else {}),
        "Schedule": _spec(job),
        "Next instant (UTC)": e(_next(job)),
        "State": e(_state(job)),
        "Last outcome": _outcome_text(job.last_outcome, _last(job)),
        "Last duration": e(_duration(job.last_duration)),
        "Last success (UTC)": e(_time(job.last_success)),
        "Failures in a row": e(job.consecutive_failures if not job.per_instance else "-"),
    }
    if job.policies:
        facts["Policies"] = e(policy_text(job.policies))
    if job.last_error:
        facts["Last error"] = f"<pre>{e(job.last_error)}</pre>"
    if job.skipped_through is not None:
        facts["Overrun instants skipped through"] = e(_time(job.skipped_through))
    if not job.per_instance:
        facts["Missed instants (last day)"] = e(job.missed)
        facts["Skipped by its catch-up policy (last day)"] = e(job.skipped)
    if job.acknowledgement is not None:
        facts["Missed instants acknowledged"] = e(
            f"{job.missed_acknowledged} of the last day; " + _acknowledged(job.acknowledgement)
        )
    if job.backfill_queued or job.backfilling is not None or job.backfill_cancelled:
        facts["Backfill"] = e(_backfill(job))
    if job.specs_seen:
        facts["Specs the replicas registered"] = _list(
            f"<code>{e(spec)}</code>" for spec in job.specs_seen
        )
    body = [
        f'<p class=summary><a href="{e(prefix)}/">All jobs</a> · checked '
        f"{e(_time(checked_at))} UTC</p>",
    ]
    if job.problems:
        body.append(_list(f'<span class="bad">{e(p)}</span>' for p in job.problems))
    if job.activity is admin.Activity.RETIRED:
        body.append(
            "<p>Retired: no live replica registers this job, so nothing runs it. "
            f"<code>cronjob forget {e(shlex.quote(job.name))}</code> deletes its record.</p>"
        )
    body.append(
        "<dl>" + "".join(f"<dt>{e(k)}</dt><dd>{v}</dd>" for k, v in facts.items()) + "</dl>"
    )
    other = job_href(prefix, job.name, failed=not failed)
    title = "Recent failed rounds" if failed else "Recent rounds"
    switch = "show every round" if failed else "only failures"
    body.append(f'<h2>{title} <small>(<a href="{e(other)}">{switch}</a>)</small></h2>')
    headers = [
        "Instant (UTC)",
        "Attempt",
        "Replica",
        "Why",
        "Started (UTC)",
        "Duration",
        "Outcome",
        "Error",
        "Trace id",
    ]
    rows = [
        _row(
            {
                "Instant (UTC)": e(_time(r.instant)),
                "Attempt": e(r.attempt),
                "Replica": e(r.replica),
                "Why": e(r.why if r.requested_by is None else f"{r.why} ({r.requested_by})"),
                "Started (UTC)": e(_time(r.started)),
                "Duration": e(_duration(r.duration)),
                "Outcome": _outcome_text(r.outcome, str(r.outcome)),
                "Error": e(_cut(r.error)) if r.error else "",
                "Trace id": f"<code>{e(r.trace_id)}</code>" if r.trace_id else "",
            },
            problem=str(r.outcome) in (admin.Outcome.FAILED, admin.Outcome.GAVE_UP),
        )
        for r in rounds
    ]
    body.append(_table(headers, rows, empty="No rounds on record."))
    return _document(f"cronjob: {job.name}", prefix, body)


def error_page(title: str, message: str, prefix: str) -> str:
    """A page that says, in one line, why the status cannot be shown."""
    return _document(f"cronjob: {title}", prefix, [f'<p class="bad">{e(message)}</p>'])


# -- pieces -----------------------------------------------------------------------------


def _document(title: str, prefix: str, body: Iterable[str]) -> str:
    return (
        "<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width, initial-scale=1">'
        f"<title>{e(title)}</title><style>{_STYLE}</style></head>\n<body>"
        f'<h1><a href="{e(prefix)}/">{e(title)}</a></h1>\n' + "\n".join(body) + "\n</body></html>\n"
    )


def _table(headers: list[str], rows: list[str], *, empty: str) -> str:
    if not rows:
        return f"<p>{e(empty)}</p>"
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "\n".join(rows)
    return (
        f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>\n{body}\n'
        "</tbody></table></div>"
    )


#: Columns whose text may be long: wrapped anywhere, where the others keep to one line.
_WRAPPED = frozenset({"Error", "Trace id"})
#: Columns of several words: wrapped between words, so that a table of every column fits
#: a laptop's screen (1280 px) without a sideways scroll.
_SOFT = frozenset({"Job", "Task", "State", "Last", "Policies", "Tasks", "Missed"})


def _row(cells: dict[str, str], *, problem: bool) -> str:
    """A table row of cells already rendered; each labelled for the narrow layout."""
    tds = "".join(
        f'<td data-label="{e(label)}"{_class(label)}>{cell}</td>' for label, cell in cells.items()
    )
    return f'<tr class="problem">{tds}</tr>' if problem else f"<tr>{tds}</tr>"


def _class(label: str) -> str:
    """The class attribute of a cell of column ``label``: how it wraps."""
    return " class=wrap" if label in _WRAPPED else " class=soft" if label in _SOFT else ""


def _replicas(replicas: Sequence[admin.ReplicaStatus]) -> str:
    tasks = any(r.tasks for r in replicas)  # a column once a replica runs schedules
    rows = [
        _row(
            {
                "Replica": e(r.id),
                "Host": e(r.host),
                "PID": e(r.pid),
                "Version": e(r.version),
                "Started (UTC)": e(_time(r.started)),
                "Last seen (UTC)": e(_time(r.last_seen)),
                "Jobs": e(len(r.jobs)),  # the count, as the command shows: may be thousands
            }
            | ({"Tasks": e(", ".join(r.tasks) or "-")} if tasks else {}),
            problem=False,
        )
        for r in replicas
    ]
    headers = ["Replica", "Host", "PID", "Version", "Started (UTC)", "Last seen (UTC)", "Jobs"]
    if tasks:
        headers.append("Tasks")
    return _table(headers, rows, empty="No live replica (none seen in the last minute).")


def _retired(jobs: Sequence[admin.JobStatus], prefix: str) -> str:
    rows = [
        _row(
            {
                "Job": f'<a href="{e(job_href(prefix, job.name))}">{e(job.name)}</a>',
                "Schedule": _spec(job),
                "Last": _outcome_text(job.last_outcome, _last(job)),
                "Last success (UTC)": e(_time(job.last_success)),
            },
            problem=False,
        )
        for job in jobs
    ]
    headers = ["Job", "Schedule", "Last", "Last success (UTC)"]
    return _table(headers, rows, empty="No retired job.")


def _missed(job: admin.JobStatus) -> str:
    """The Missed cell: the count, and those acknowledged beside it (``2 (+3 acked)``)."""
    if job.per_instance:
        return "-"
    acked = f" (+{job.missed_acknowledged} acked)" if job.missed_acknowledged else ""
    return f"{job.missed}{acked}"


def _spec(job: admin.JobStatus) -> str:
    spec = f"<code>{e(job.spec)}</code>" if job.spec is not None else "?"
    if job.per_instance:
        spec += " (per instance)"
    if job.specs_seen:
        spec += ' <span class="bad">(replicas disagree)</span>'
    return spec


def _outcome_text(outcome: object, text: str) -> str:
    """``text`` about an outcome, coloured by it."""
    if outcome in admin.FAILED_OUTCOMES:
        return f'<span class="bad">{e(text)}</span>'
    if outcome == admin.Outcome.SUCCEEDED:
        return f'<span class="ok">{e(text)}</span>'
    return e(text)


def _list(items: Iterable[str]) -> str:
    return "<ul>" + "".join(f"<li>{item}</li>" for item in items) + "</ul>"


def _cut(text: str) -> str:
    return text if len(text) <= ERROR_CELL else text[: ERROR_CELL - 1] + "…"


def _s(count: int) -> str:
    return "" if count == 1 else "s"
