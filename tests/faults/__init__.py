"""Fault-injection proof: replicas as real ``cronjob run`` processes, killed, cut off,
restarted, against PostgreSQL, MariaDB and SQLite.

``harness`` starts the replicas, injects the faults and checks the invariants over the
event log the job modules (``jobs_*``) append to; ``test_faults`` is the short profile
(pytest, marked ``faults``); ``python -m tests.faults --soak MINUTES`` is the long soak.

This package imports nothing at the top: the job modules, imported by ``cronjob run`` as
``tests.faults.jobs_*``, stay light.
"""
