"""The lease table's database, from Django's settings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

__all__ = ["DEFAULT_ALIAS", "database_alias", "database_url", "url_from_settings"]

#: The ``DATABASES`` alias that holds the lease table unless ``CRONJOB_DATABASE`` says.
DEFAULT_ALIAS = "default"

#: Django's database vendor -> the SQLAlchemy driver the lease statements use.
_DRIVERS = {"postgresql": "postgresql+psycopg", "mysql": "mysql+pymysql", "sqlite": "sqlite"}

#: PostgreSQL ``OPTIONS`` that are Django's own, not libpq connection parameters.
_DJANGO_PG_OPTIONS = frozenset(
    {"isolation_level", "server_side_binding", "pool", "assume_role", "cursor_factory"}
)


def database_alias() -> str:
    """The ``DATABASES`` alias of the lease table: ``settings.CRONJOB_DATABASE``."""
    from django.conf import settings

    alias: str = getattr(settings, "CRONJOB_DATABASE", DEFAULT_ALIAS)
    return alias


def database_url() -> str:
    """Return the URL the scheduler uses: ``CRONJOB_DATABASE_URL``, else Django's database.

    The database is ``DATABASES[CRONJOB_DATABASE]`` (``"default"`` unless set) as the
    connection sees it, so under Django's test runner it is the test database. The URL
    carries the password (the scheduler needs it); never log it, use ``lease.redact``.

    Raises:
        django.core.exceptions.ImproperlyConfigured: the alias does not exist, is a read
            replica (``TEST["MIRROR"]``), is in memory, or uses a backend the lease
            table cannot live in. One line, naming the alias and what to set instead.
    """
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.db import connections
    from django.utils.connection import ConnectionDoesNotExist

    explicit: str | None = getattr(settings, "CRONJOB_DATABASE_URL", None)
    if explicit:
        return explicit
    alias = database_alias()
    try:
        connection = connections[alias]
    except ConnectionDoesNotExist:
        raise ImproperlyConfigured(
            f"cronjob: CRONJOB_DATABASE names {alias!r}, which is not in DATABASES"
        ) from None
    return url_from_settings(connection.settings_dict, connection.vendor, alias)


def url_from_settings(config: Mapping[str, Any], vendor: str, alias: str) -> str:
    """Build the SQLAlchemy URL of one ``DATABASES`` entry (see `database_url`)."""
    from django.core.exceptions import ImproperlyConfigured

    where = f"cronjob: DATABASES[{alias!r}]"
    instead = "set CRONJOB_DATABASE to a primary's alias or CRONJOB_DATABASE_URL to a URL"
    mirror = (config.get("TEST") or {}).get("MIRROR")
    if mirror:
        raise ImproperlyConfigured(
            f"{where} is a read replica of {mirror!r}: the lease table is written on "
            f"every claim and needs a primary; {instead}"
        )
    driver = _DRIVERS.get(vendor)
    if driver is None:
        raise ImproperlyConfigured(
            f"{where} uses {config.get('ENGINE')!r}, a backend the lease table cannot live "
            f"in (PostgreSQL, MariaDB/MySQL and SQLite can); {instead}"
        )
    name = str(config.get("NAME") or "")
    if vendor == "sqlite":
        if not name or name == ":memory:" or "mode=memory" in name:
            raise ImproperlyConfigured(
                f"{where} is an in-memory SQLite database, which no other connection can "
                f"share; name a file, or {instead}"
            )
        return sa.URL.create(driver, database=name).render_as_string(hide_password=False)
    options: Mapping[str, Any] = config.get("OPTIONS") or {}
    query: dict[str, str] = {}
    host = str(config.get("HOST") or "") or None
    if host is not None and host.startswith("/"):  # a Unix socket's directory or path
        query["host" if vendor == "postgresql" else "unix_socket"] = host
        host = None
    if vendor == "postgresql":
        for key, value in options.items():
            if key not in _DJANGO_PG_OPTIONS and isinstance(value, str | int):
                query[key] = str(value)
        # Django's setting for a transaction pooler (PgBouncer): say so to the lease too.
        if config.get("DISABLE_SERVER_SIDE_CURSORS"):
            query["pooler"] = "transaction"
    elif "charset" in options:
        query["charset"] = str(options["charset"])
    port = config.get("PORT")
    url = sa.URL.create(
        driver,
        username=str(config.get("USER") or "") or None,
        password=str(config.get("PASSWORD") or "") or None,
        host=host,
        port=int(port) if port else None,
        database=name or None,
        query=query,
    )
    return url.render_as_string(hide_password=False)
