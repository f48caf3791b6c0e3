"""Flask: the `Cronjob` extension and ``flask cronjob ...``.

``Cronjob(app)`` (or ``cronjob_ext.init_app(app)`` in an application factory) reads:

- ``CRONJOB_DATABASE_URL``: the lease table's database; unset, the application's
  ``SQLALCHEMY_DATABASE_URI`` (Flask-SQLAlchemy's), else ``$CRONJOB_DATABASE_URL``, else
  the embedded SQLite file, as for [cronjob.Scheduler][].
- ``CRONJOB_IMPORTS``: modules that register jobs, imported by ``init_app`` (a module
  that raises fails the application's creation, naming it).

and adds ``flask cronjob ...``: the ``cronjob`` command (``run``, ``next``, and the
others the installed version has) on that database, ``run`` needing no module.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

import click
from flask import Flask, current_app
from flask.cli import with_appcontext

from ..admin._cli import main
from ..engine import Scheduler

__all__ = ["Cronjob", "command"]

#: Where the extension keeps itself: ``app.extensions[EXTENSION]``.
EXTENSION = "cronjob"


class Cronjob:
    """The Flask extension: configuration, job modules, and the ``flask cronjob`` command.

    Args:
        app: The application; ``None`` to call `init_app` later (a factory).
    """

    def __init__(self, app: Flask | None = None) -> None:
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Read the configuration, import ``CRONJOB_IMPORTS``, add ``flask cronjob``.

        Raises:
            RuntimeError: a module of ``CRONJOB_IMPORTS`` raised on import (a job refused
                at registration, or any error); the message names the module and why.
        """
        app.config.setdefault("CRONJOB_DATABASE_URL", None)
        app.config.setdefault("CRONJOB_IMPORTS", [])
        _import_all(app.config["CRONJOB_IMPORTS"])
        app.extensions[EXTENSION] = self
        app.cli.add_command(command)

    def database_url(self, app: Flask | None = None) -> str | None:
        """The configured database (see the module docstring); ``None`` leaves it to the
        scheduler's own default (``$CRONJOB_DATABASE_URL``, else the SQLite file)."""
        config = (app or current_app).config
        url = config.get("CRONJOB_DATABASE_URL") or config.get("SQLALCHEMY_DATABASE_URI")
        return str(url) if url else None

    def scheduler(self, app: Flask | None = None, **options: Any) -> Scheduler:
        """A [cronjob.Scheduler][] on the configured database, not started.

        For a scheduler inside the web workers (``scheduler.start()`` in the factory;
        see the README for when to prefer ``flask cronjob run``). ``options`` are the
        scheduler's keyword arguments.
        """
        return Scheduler(self.database_url(app), **options)


def _import_all(modules: Iterable[str]) -> None:
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:
            raise RuntimeError(
                f"cronjob: importing {module!r} (CRONJOB_IMPORTS) failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc


@click.command(
    "cronjob",
    context_settings={"ignore_unknown_options": True},
    add_help_option=False,  # `flask cronjob --help` is the cronjob command's own help
    help="The cronjob command (run, next, ...) on this application's database.",
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@with_appcontext
def command(args: tuple[str, ...]) -> None:
    """``flask cronjob ARGS...``: `cronjob.admin._cli.main` with the app's defaults."""
    extension = current_app.extensions.get(EXTENSION)
    url = extension.database_url() if isinstance(extension, Cronjob) else None
    status = main(list(args), prog="flask cronjob", database_url=url, jobs_imported=True)
    click.get_current_context().exit(status)
