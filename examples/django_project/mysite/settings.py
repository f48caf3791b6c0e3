"""The settings the example needs: the app, and the database the lease table shares."""

import os
from pathlib import Path

SECRET_KEY = "example-only"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["cronjob.contrib.django", "shop"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",  # or postgresql, mysql: the same settings
        "NAME": os.environ.get("EXAMPLE_DB", Path(__file__).parent.parent / "db.sqlite3"),
    }
}
