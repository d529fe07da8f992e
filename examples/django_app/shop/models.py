"""The business data a job belongs to."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    """An order; its confirmation email is a Shigoto job enqueued in the same transaction."""

    email = models.EmailField()
    total = models.DecimalField(max_digits=10, decimal_places=2)
    created_at = models.DateTimeField(auto_now_add=True)
