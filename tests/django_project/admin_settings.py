"""The test project with Django's admin (tests/test_django_admin.py): the settings of
``settings`` plus the apps, middleware, templates and URLs the admin needs.

``CRONJOB_TEST_DJANGO_PG_NAME`` names the PostgreSQL database a dev server uses (the
browser test makes one of its own); Django's test runner makes its own test database.
"""

import os

from settings import *  # noqa: F403
from settings import DATABASES, INSTALLED_APPS

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    *INSTALLED_APPS,
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
ROOT_URLCONF = "admin_urls"
DEBUG = True
TIME_ZONE = "UTC"  # the forms read datetimes in it
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

if os.environ.get("CRONJOB_TEST_DJANGO_PG_NAME"):
    DATABASES["default"]["NAME"] = os.environ["CRONJOB_TEST_DJANGO_PG_NAME"]
