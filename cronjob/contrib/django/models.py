"""The ``cronjob_schedule`` table as a Django model, for reading only: the admin lists
and searches schedules through it (`cronjob.contrib.django.admin`).

The table is lease's (``cronjob migrate`` makes it), not Django's: the model is
unmanaged (no migration creates or changes it) and maps only the columns the admin shows.
Nothing writes through it: every change goes through `cronjob.contrib.django.schedules`,
which checks the values, locks the change counter and tells the replicas.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from django.db import models

__all__ = ["Schedule"]


class LiveSchedules(models.Manager):
    """The live schedules: a removed one stays as a tombstone row, which no one sees."""

    def get_queryset(self) -> models.QuerySet[Schedule]:
        return super().get_queryset().filter(removed=0)


def _instant(seconds: int | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


class Schedule(models.Model):
    """A live row of ``cronjob_schedule`` (tombstones are filtered out): read it, write
    it with `cronjob.contrib.django.schedules`. ``save()`` and ``delete()`` refuse."""

    id = models.CharField(max_length=200, primary_key=True)
    task = models.CharField(max_length=200)
    spec = models.TextField(null=True, blank=True)
    at_s = models.BigIntegerField(null=True, blank=True)
    start_s = models.BigIntegerField(null=True, blank=True)
    end_s = models.BigIntegerField(null=True, blank=True)
    removed = models.SmallIntegerField(default=0)

    objects: ClassVar[LiveSchedules] = LiveSchedules()

    class Meta:
        managed = False
        db_table = "cronjob_schedule"
        ordering = ("id",)
        verbose_name = "schedule"
        verbose_name_plural = "schedules"

    def __str__(self) -> str:
        return str(self.id)

    @property
    def at(self) -> datetime | None:
        """A one-off schedule's one instant (UTC), or ``None``."""
        return _instant(self.at_s)

    @property
    def start(self) -> datetime | None:
        """No instant before this one (UTC), or ``None``."""
        return _instant(self.start_s)

    @property
    def end(self) -> datetime | None:
        """No instant after this one (UTC), or ``None``."""
        return _instant(self.end_s)

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Refused: write with `cronjob.contrib.django.schedules` (``add``, ``update``)."""
        raise TypeError(
            "cronjob schedules are written with cronjob.contrib.django.schedules, not the ORM"
        )

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        """Refused: remove with `cronjob.contrib.django.schedules.remove`."""
        raise TypeError(
            "cronjob schedules are removed with cronjob.contrib.django.schedules.remove, "
            "not the ORM"
        )
