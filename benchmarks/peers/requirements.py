"""Pinned requirements of each peer's virtualenv (installed from PyPI)."""

APSCHEDULER3 = ["APScheduler==3.11.3", "SQLAlchemy==2.0.43", "psycopg[binary]==3.2.10"]
APSCHEDULER4 = [
    "APScheduler==4.0.0a6",
    "sniffio==1.3.1",  # imported by its SQLAlchemy data store, not declared
    "SQLAlchemy==2.0.43",
    "psycopg[binary]==3.2.10",
]
# procrastinate talks to PostgreSQL through psycopg 3 and its pool, not SQLAlchemy: its
# worker counts statements by wrapping psycopg's cursor (see workers/procrastinate_worker.py).
PROCRASTINATE = [
    "procrastinate==3.10.0",
    "psycopg[binary]==3.3.9",
    "psycopg-pool==3.3.3",
    "asgiref==3.13.0",
    "croniter==7.0.0",
]
DBOS = [
    "dbos==3.4.0",
    "SQLAlchemy==2.1.9",
    "psycopg[binary]==3.3.9",
    "croniter==7.0.0",
]
