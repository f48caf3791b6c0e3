"""The processes the scenarios start: one module or script per scheduler.

Each worker reads its work from the environment (``BENCH_*``, see :mod:`._record`), runs
until SIGTERM, and on exit writes what it saw to ``$BENCH_OUT`` as JSON. They import only
the standard library, SQLAlchemy and their own scheduler, so a peer's virtualenv can run
them.
"""
