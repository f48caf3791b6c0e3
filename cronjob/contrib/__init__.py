"""Integrations with the frameworks applications already use, each behind an extra.

- ``cronjob.contrib.django`` (``pip install 'cronjob-lease[django]'``): an app for
  ``INSTALLED_APPS``, ``manage.py cronjob``, fenced ORM transactions.
- ``cronjob.contrib.flask`` (``[flask]``): the ``Cronjob`` extension and ``flask cronjob``.
- ``cronjob.contrib.celery`` (``[celery]``): ``send`` a Celery task once per instant,
  ``once`` on the worker, and ``cronjob beat -A APP``.
- ``cronjob.contrib.dramatiq`` (``[dramatiq]``): ``send``, a job that hands each instant
  to a Dramatiq actor, and ``once`` for the worker's actor.
- ``cronjob.contrib.rq`` (``[rq]``): each instant handed to an RQ queue, and ``once``.

What every task-queue target shares lives here, needing no extra: `handoff` (a publisher
made a job function: the outbox), `run_once` (a worker's body once per occurrence id;
the ``once`` wrappers raise `InvalidOccurrence` for a message whose claim does not check out),
and the instant as every message carries it (`format_instant`, `parse_instant`).

The pytest plugin (`cronjob.pytest_plugin`) needs no extra. Importing this package
imports no framework.
"""

from ._handoff import Handoff as Handoff
from ._handoff import NotPublished as NotPublished
from ._handoff import Occurrence as Occurrence
from ._handoff import Publisher as Publisher
from ._handoff import handoff as handoff
from ._instant import format_instant as format_instant
from ._instant import parse_instant as parse_instant
from ._once import OccurrenceBusy as OccurrenceBusy
from ._once import run_once as run_once
from ._validation import InvalidOccurrence as InvalidOccurrence

__all__ = [
    "Handoff",
    "InvalidOccurrence",
    "NotPublished",
    "Occurrence",
    "OccurrenceBusy",
    "Publisher",
    "format_instant",
    "handoff",
    "parse_instant",
    "run_once",
]

for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("cronjob.contrib._"):
        _obj.__module__ = __name__
del _name, _obj
