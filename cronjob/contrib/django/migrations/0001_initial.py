"""The unmanaged ``Schedule`` model: Django's record of it, no table (lease makes it)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies = ()

    operations = (
        migrations.CreateModel(
            name="Schedule",
            fields=[
                ("id", models.CharField(max_length=200, primary_key=True, serialize=False)),
                ("task", models.CharField(max_length=200)),
                ("spec", models.TextField(blank=True, null=True)),
                ("at_s", models.BigIntegerField(blank=True, null=True)),
                ("start_s", models.BigIntegerField(blank=True, null=True)),
                ("end_s", models.BigIntegerField(blank=True, null=True)),
                ("removed", models.SmallIntegerField(default=0)),
            ],
            options={
                "verbose_name": "schedule",
                "verbose_name_plural": "schedules",
                "db_table": "cronjob_schedule",
                "ordering": ("id",),
                "managed": False,
            },
        ),
    )
