"""Pinned requirements of each peer's virtualenv (installed from PyPI)."""

APSCHEDULER3 = ["APScheduler==3.11.3", "SQLAlchemy==2.0.43", "psycopg[binary]==3.2.10"]
APSCHEDULER4 = [
    "APScheduler==4.0.0a6",
    "sniffio==1.3.1",  # imported by its SQLAlchemy data store, not declared
    "SQLAlchemy==2.0.43",
    "psycopg[binary]==3.2.10",
]
