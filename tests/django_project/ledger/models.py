from django.db import models


class Entry(models.Model):
    job = models.CharField(max_length=100)
    instant = models.DateTimeField()
