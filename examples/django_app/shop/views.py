"""One view: place an order. The order row and its confirmation job commit together, or
neither does."""

from __future__ import annotations

import json
from decimal import Decimal

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from shigoto.integrations.django import enqueue
from shop.models import Order
from shop.workers import send_confirmation


class PaymentDeclined(Exception):
    """The payment failed after the order and its job were written: both must go."""


@csrf_exempt
@require_POST
def place_order(request: HttpRequest) -> JsonResponse:
    body = json.loads(request.body)
    order_id = None
    try:
        with transaction.atomic():
            order = Order.objects.create(email=body["email"], total=Decimal(body["total"]))
            order_id = order.id
            job = enqueue(send_confirmation, {"order_id": order.id, "email": order.email})
            if body.get("card") == "declined":
                raise PaymentDeclined(order.id)
    except PaymentDeclined:
        return JsonResponse({"order_id": order_id, "error": "payment declined"}, status=402)
    return JsonResponse({"order_id": order.id, "job_id": job.id}, status=201)
