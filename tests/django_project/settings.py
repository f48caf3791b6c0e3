"""Settings of the Django project the tests run (tests/test_django.py).

``CRONJOB_TEST_DJANGO_DB`` picks the database: ``sqlite`` (a file in
``CRONJOB_TEST_DJANGO_DIR``), ``postgres`` or ``mysql`` (the test servers, MariaDB through
PyMySQL; Django's test runner makes and drops a test database of a name of its own).
``CRONJOB_TEST_DJANGO_APPS`` adds apps.
"""

import os
import uuid

SECRET_KEY = "tests-only"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "cronjob.contrib.django",
    "ledger",
    *filter(None, os.environ.get("CRONJOB_TEST_DJANGO_APPS", "").split(",")),
]

_backend = os.environ.get("CRONJOB_TEST_DJANGO_DB", "sqlite")
_here = os.environ.get("CRONJOB_TEST_DJANGO_DIR", ".")
if _backend == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": "127.0.0.1",
            "PORT": "5432",
            "USER": "postgres",
            "NAME": "test",
            # Several developers run the suite at once on one server.
            "TEST": {"NAME": f"test_cronjob_django_{uuid.uuid4().hex[:12]}"},
        }
    }
elif _backend == "mysql":
    import pymysql

    pymysql.install_as_MySQLdb()  # Django's MySQL backend imports MySQLdb
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "HOST": "127.0.0.1",
            "PORT": "3306",
            "USER": "root",
            "NAME": "test",
            "TEST": {"NAME": f"test_cronjob_django_{uuid.uuid4().hex[:12]}"},
        }
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.path.join(_here, "app.sqlite"),
            # A file, not Django's in-memory test default: the scheduler shares it.
            "TEST": {"NAME": os.path.join(_here, "test_app.sqlite")},
        }
    }
