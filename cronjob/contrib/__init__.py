"""Integrations with the frameworks applications already use, each behind an extra.

- ``cronjob.contrib.django`` (``pip install 'cronjob-lease[django]'``): an app for
  ``INSTALLED_APPS``, ``manage.py cronjob``, fenced ORM transactions.
- ``cronjob.contrib.flask`` (``[flask]``): the ``Cronjob`` extension and ``flask cronjob``.
- ``cronjob.contrib.dramatiq`` (``[dramatiq]``): ``send``, a job that hands each instant
  to a Dramatiq actor, and ``once`` for the worker's actor.

The pytest plugin (`cronjob.pytest_plugin`) needs no extra. Importing this package
imports no framework.
"""
