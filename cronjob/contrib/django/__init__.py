"""Django: jobs in each installed app's ``cronjobs`` module, the lease table in Django's
database, ``manage.py cronjob ...``, and ORM transactions fenced by a round's lease.

Add ``"cronjob.contrib.django"`` to ``INSTALLED_APPS``. Settings (all optional):

- ``CRONJOB_MODULE_NAME``: the module imported from each installed app at start-up
  (default ``"cronjobs"``), as Django's ``admin`` imports each app's ``admin`` module.
- ``CRONJOB_DATABASE``: the alias in ``DATABASES`` that holds the lease table (default
  ``"default"``); it must be a primary on PostgreSQL, MariaDB/MySQL or SQLite.
- ``CRONJOB_DATABASE_URL``: a SQLAlchemy URL that overrides the alias (then
  `fenced` cannot check leases on Django's connection: keep the two together).

Schedules made of data are written on Django's connection, in its atomic blocks, with
`cronjob.contrib.django.schedules` (``from cronjob.contrib.django import schedules``);
with ``"django.contrib.admin"`` installed too, Django's admin lists and edits them
(`cronjob.contrib.django.admin`).
"""

# The layout: apps (the app and its discovery of job modules), _database (the URL),
# _fenced (fenced), schedules (the schedule calls on Django's connection),
# models (the schedule table, read-only) and admin (Django's admin of it, autodiscovered),
# management/commands/cronjob (the command).

from __future__ import annotations

from ._database import database_url as database_url
from ._fenced import fenced as fenced

__all__ = ["database_url", "fenced"]
