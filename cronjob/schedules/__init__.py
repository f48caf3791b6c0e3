"""Schedules made of data: a task's schedules as rows, added, changed and removed at run
time, in the application's own transaction.

A **task** is code registered at import time ([cronjob.task][]); its schedules are rows
of the lease database, each with its own id, spec (or one-off instant), zone and JSON
arguments. Every running replica that registers the task sees a committed change within
2 s, without a restart, and runs each schedule as a leased job: once per instant across
the replicas, under the lease named by the schedule's id.

```python
with engine.begin() as conn:                 # the application's own transaction
    conn.execute(tenants.insert().values(id=42))
    schedules.add(conn, "report:tenant-42", task="tenant-report",
                  spec="CRON_TZ=America/New_York 0 0 9 * * *", args={"tenant": 42})
```

Each call takes the database as a SQLAlchemy `Connection` (it joins that transaction), an
`Engine` or a URL (a transaction of its own); each async form (`add_async` and so on)
takes an `AsyncConnection`. A refused call writes nothing and raises a `ValueError`
that is also a [cronjob.CronjobError][]: [cronjob.ScheduleError][] for when the schedule
fires (its spec, `at`, `start`, `end`), as registration raises for a spec, and
[cronjob.RegistrationError][] for the rest (its id, task, args, policies). Catch
`ValueError` to refuse a form's input whatever the field; each function says which.
[check][cronjob.schedules.check] refuses as `add` does, writing nothing: a form's
`clean()` calls it.
"""

# The layout: _check (every value checked before anything is written), _api (the sync
# calls), _write (the write of checked rows, and when each was committed), _async (the
# same on an AsyncConnection); the statements are lease's.

from __future__ import annotations

from ._api import Database as Database
from ._api import IfExists as IfExists
from ._api import ScheduleRecord as ScheduleRecord
from ._api import add as add
from ._api import add_many as add_many
from ._api import get as get
from ._api import list as list
from ._api import remove as remove
from ._api import update as update
from ._async import add_async as add_async
from ._async import add_many_async as add_many_async
from ._async import get_async as get_async
from ._async import list_async as list_async
from ._async import remove_async as remove_async
from ._async import update_async as update_async
from ._check import MAX_ARGS_BYTES as MAX_ARGS_BYTES
from ._check import New as New
from ._check import check as check

__all__ = [
    "MAX_ARGS_BYTES",
    "Database",
    "IfExists",
    "New",
    "ScheduleRecord",
    "add",
    "add_async",
    "add_many",
    "add_many_async",
    "check",
    "get",
    "get_async",
    "list",
    "list_async",
    "remove",
    "remove_async",
    "update",
    "update_async",
]

for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("cronjob.schedules._"):
        _obj.__module__ = __name__
del _name, _obj
