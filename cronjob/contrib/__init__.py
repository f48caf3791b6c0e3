"""Integrations with the frameworks applications already use, each behind an extra.

- ``cronjob.contrib.django`` (``pip install 'cronjob-lease[django]'``): an app for
  ``INSTALLED_APPS``, ``manage.py cronjob``, fenced ORM transactions.
- ``cronjob.contrib.flask`` (``[flask]``): the ``Cronjob`` extension and ``flask cronjob``.
- ``cronjob.contrib.celery`` (``[celery]``): ``send`` a Celery task once per instant,
  ``once`` on the worker, and ``cronjob beat -A APP``.

The pytest plugin (`cronjob.pytest_plugin`) needs no extra. Importing this package
imports no framework.
"""
