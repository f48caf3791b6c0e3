"""Celery (``pip install 'cronjob-lease[celery]'``): hand each instant to a Celery task.

- [send][cronjob.contrib.celery.send] builds a job function that publishes one task
  message per instant (task id = the occurrence id, the instant in the
  ``cronjob_instant`` header, the round's trace context in ``traceparent``), through
  [CeleryPublisher][cronjob.contrib.celery.CeleryPublisher];
- [once][cronjob.contrib.celery.once] makes a task's body run once per task id;
- ``cronjob beat -A proj`` runs a Celery app's ``beat_schedule`` on every replica
  (`cronjob.contrib.celery.register_beat_schedule`).
"""

# Modules: _publisher (the message), _send (the job function), _once (the worker side),
# _beat (reading beat_schedule), _beat_cli (the command).

from ._beat import BeatScheduleError as BeatScheduleError
from ._beat_cli import register_beat_schedule as register_beat_schedule
from ._once import once as once
from ._publisher import CeleryPublisher as CeleryPublisher
from ._publisher import OptionError as OptionError
from ._send import send as send

__all__ = [
    "BeatScheduleError",
    "CeleryPublisher",
    "OptionError",
    "once",
    "register_beat_schedule",
    "send",
]

for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
