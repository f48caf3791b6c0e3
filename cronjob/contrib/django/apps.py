"""The Django app: imports each installed app's job module when Django is ready."""

from __future__ import annotations

from importlib import import_module

from django.apps import AppConfig, apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import module_has_submodule

__all__ = ["DEFAULT_MODULE_NAME", "CronjobConfig", "import_job_modules"]

#: The module imported from each installed app unless ``CRONJOB_MODULE_NAME`` says.
DEFAULT_MODULE_NAME = "cronjobs"


class CronjobConfig(AppConfig):
    """``"cronjob.contrib.django"`` in ``INSTALLED_APPS``.

    At ``ready()`` it imports ``<app>.cronjobs`` from every installed app that has one,
    so their jobs register on the default registry. It starts nothing: the scheduler
    runs in ``manage.py cronjob run`` or wherever the project starts a
    ``cronjob.Scheduler`` (see the README).
    """

    name = "cronjob.contrib.django"
    label = "cronjob"
    verbose_name = "cronjob"

    def ready(self) -> None:
        import_job_modules(getattr(settings, "CRONJOB_MODULE_NAME", DEFAULT_MODULE_NAME))


def import_job_modules(module_name: str) -> list[str]:
    """Import ``<app>.<module_name>`` of each installed app that has it; return them.

    Raises:
        ImproperlyConfigured: a module raised on import (a job refused at registration,
            or any error): the message names the app, the module and the error, so the
            process fails at start instead of running without the app's jobs.
    """
    imported = []
    for app in apps.get_app_configs():
        if not module_has_submodule(app.module, module_name):
            continue
        module = f"{app.name}.{module_name}"
        try:
            import_module(module)
        except Exception as exc:
            raise ImproperlyConfigured(
                f"cronjob: app {app.label!r}: importing {module!r} failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        imported.append(module)
    return imported
