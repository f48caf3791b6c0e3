"""A Celery app with a ``beat_schedule``, for ``cronjob beat -A tests.celery_beat_app``.

``$CELERY_TEST_BEAT`` picks the schedule: ``every`` (one entry every second, to the
task of tests/celery_worker.py on ``$CELERY_TEST_QUEUE``), or ``solar`` (an entry that
must be refused at start)."""

from __future__ import annotations

import os
from datetime import timedelta

from celery import Celery
from celery.schedules import solar

app = Celery("cronjob_beat_test", broker=os.environ.get("CELERY_TEST_BROKER", "memory://"))
app.conf.broker_connection_timeout = 5

if os.environ.get("CELERY_TEST_BEAT") == "solar":
    app.conf.beat_schedule = {
        "every-second": {"task": "cronjob_test.record", "schedule": 1.0},
        "at-dusk": {"task": "cronjob_test.record", "schedule": solar("dusk_civil", 48.8, 2.3)},
    }
else:
    app.conf.beat_schedule = {
        "every-second": {
            "task": "cronjob_test.record",
            "schedule": timedelta(seconds=1),
            "args": (7,),
            "kwargs": {"source": "beat"},
            "options": {"queue": os.environ.get("CELERY_TEST_QUEUE", "celery")},
        },
    }
