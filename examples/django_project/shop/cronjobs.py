"""Imported at start-up by cronjob.contrib.django: registering is all it does."""

from datetime import timedelta

import cronjob
from cronjob.contrib.django import fenced

from .models import Order


@cronjob.job("CRON_TZ=Europe/Paris 0 0 3 * * *", name="close-stale-orders")
def close_stale_orders(ctx: cronjob.Round) -> None:
    """Every night at 03:00 Paris time, once across all replicas."""
    with fenced(ctx):  # the writes commit only while this round holds its lease
        stale = Order.objects.filter(state="open", created__lt=ctx.instant - timedelta(days=7))
        stale.update(state="closed")
