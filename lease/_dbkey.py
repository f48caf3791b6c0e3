"""The key that names a database within this process, whatever the URL that reaches it.

Stores of one process that write one database find each other by it: the watchers of
lease writes and schedule changes (`LeaseStore.watch`), which schedulers on a fake clock
follow instead of polling, and the lock of held rows. Two URLs that reach the same
database must give the same key, or a change committed through one is never told to the
schedulers of the other:

- the driver is left out (``postgresql+psycopg`` and ``postgresql+asyncpg`` reach the
  same server; MariaDB's ``mariadb`` is ``mysql``);
- a host name is resolved, once per process: the loopback addresses all become
  ``localhost``, any other host the least of its addresses; a name that does not
  resolve stays itself, in lower case;
- a missing port is the backend's default;
- a SQLite file is named by its real path (``dir/./file``, a relative path, a symlink);
- the password is never part of it (it is kept in memory and may be logged);
- PyMySQL's ``ssl_disabled`` is left out: it does not name a database, and the async
  URL of a MariaDB/MySQL one goes without it (`lease.async_url`).

The database name, user and query (a PostgreSQL ``search_path``, say) stay: they may
name another database on the same server.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import socket
from typing import Final

import sqlalchemy as sa

from ._engine import PYMYSQL_ONLY_OPTIONS

__all__ = ["database_key"]

#: The port a URL without one reaches, by backend.
_DEFAULT_PORTS: Final = {"postgresql": 5432, "mysql": 3306}


@functools.lru_cache(maxsize=256)
def _host_key(host: str) -> str:
    """``host`` as the address the key names: ``localhost`` for the loopback, else the
    least address it resolves to (itself, lower case, when it does not resolve)."""
    name = host.strip("[]").lower()
    try:
        found = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return name
    addresses = {str(info[4][0]).split("%")[0] for info in found}
    if not addresses:
        return name
    if all(ipaddress.ip_address(address).is_loopback for address in addresses):
        return "localhost"
    return min(addresses)


def database_key(url: str | sa.URL) -> str:
    """The key of the database ``url`` reaches (see the module docstring).

    Raises:
        sqlalchemy.exc.ArgumentError: ``url`` is not a URL.
    """
    parsed = sa.make_url(url)
    backend = parsed.get_backend_name()
    backend = "mysql" if backend == "mariadb" else backend
    parsed = parsed.set(drivername=backend, password=None)
    if backend == "mysql":
        parsed = parsed.difference_update_query(PYMYSQL_ONLY_OPTIONS)
    if backend == "sqlite":
        database = parsed.database
        if database and database != ":memory:" and not database.startswith("file:"):
            parsed = parsed.set(database=os.path.realpath(database))
    else:
        if parsed.host:
            parsed = parsed.set(host=_host_key(parsed.host))
        if parsed.port is None and backend in _DEFAULT_PORTS:
            parsed = parsed.set(port=_DEFAULT_PORTS[backend])
    return parsed.render_as_string(hide_password=True)
