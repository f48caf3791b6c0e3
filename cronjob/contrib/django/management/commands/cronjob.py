"""``python manage.py cronjob ...``: the ``cronjob`` command on Django's database."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from cronjob.admin._cli import main
from cronjob.contrib.django._database import database_url


class Command(BaseCommand):
    help = (
        "The cronjob command line (cronjob run, next, ...) on this project: the jobs of "
        "every installed app's cronjobs module, the lease table in Django's database. "
        "See 'manage.py cronjob --help' after the subcommand, e.g. 'cronjob run --help'."
    )
    # The scheduler is a long-running process of its own; the checks belong to deploys.
    requires_system_checks: list[str] = []  # noqa: RUF012 (Django's own attribute)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("args", nargs=argparse.REMAINDER, metavar="COMMAND ...")

    def handle(self, *args: str, **options: Any) -> None:
        try:
            url = database_url()
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc), returncode=2) from None
        prog = f"{os.path.basename(sys.argv[0])} cronjob"
        status = main(list(args), prog=prog, database_url=url, jobs_imported=True)
        if status:
            sys.exit(status)
