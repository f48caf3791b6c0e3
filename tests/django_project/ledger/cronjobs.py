"""Found and imported by cronjob.contrib.django at ready()."""

import cronjob
from cronjob.contrib.django import fenced

from .models import Entry


@cronjob.job("0 0 * * * *", name="ledger-hourly")
def hourly(ctx: cronjob.Round) -> None:
    with fenced(ctx):
        Entry.objects.create(job=ctx.name, instant=ctx.instant)
