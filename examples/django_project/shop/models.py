from django.db import models


class Order(models.Model):
    state = models.CharField(max_length=20, default="open")
    created = models.DateTimeField(auto_now_add=True)
