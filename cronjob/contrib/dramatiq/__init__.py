"""Dramatiq: hand each instant of a job to a Dramatiq actor (``pip install
'cronjob-lease[dramatiq]'``, plus Dramatiq's own ``rabbitmq`` or ``redis`` extra).

- [send][cronjob.contrib.dramatiq.send]: the job function; one message per instant,
  its ``message_id`` the occurrence id, published through the outbox.
- [DramatiqPublisher][cronjob.contrib.dramatiq.DramatiqPublisher]: the message it
  sends, and how.
- [once][cronjob.contrib.dramatiq.once]: on the worker, an actor's body run once per
  message id.

Importing ``cronjob`` never imports this package (nor Dramatiq).
"""

from __future__ import annotations

from ._once import once as once
from ._publisher import INSTANT_OPTION as INSTANT_OPTION
from ._publisher import NAME_OPTION as NAME_OPTION
from ._publisher import TRACE_OPTION as TRACE_OPTION
from ._publisher import DramatiqPublisher as DramatiqPublisher
from ._send import send as send

__all__ = ["INSTANT_OPTION", "NAME_OPTION", "TRACE_OPTION", "DramatiqPublisher", "once", "send"]

# Public objects name the public module, so reprs and docs never show `_x`.
for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith(f"{__name__}._"):
        _obj.__module__ = __name__
del _name, _obj
