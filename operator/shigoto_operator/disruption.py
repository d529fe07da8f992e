"""The runner pods' optional PodDisruptionBudget (`spec.disruption`), kept like the ScaledObject.

It exists exactly while the spec asks for one: created, corrected when it drifts from the
spec, and deleted when the field goes. It carries an owner reference to the Queue, so the
garbage collector removes it with the Queue too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from shigoto_operator import builders, k8s
from shigoto_operator.spec import QueueSpec

Emit = Callable[[str, str, str], None]


async def ensure(
    spec: QueueSpec, owner: Mapping[str, Any], exists: bool | None, emit: Emit
) -> bool:
    """Make the PodDisruptionBudget match the spec; returns whether one exists now.

    `exists`: what the last pass left (None: unknown, after a restart), so a Queue that never
    had one costs no request per pass."""
    name = builders.runner_name(spec.name)
    if spec.disruption is not None:
        desired = builders.pod_disruption_budget(spec, owner)
        live = await k8s.get(k8s.POD_DISRUPTION_BUDGETS, spec.namespace, name)
        if live is None:
            await k8s.create(k8s.POD_DISRUPTION_BUDGETS, spec.namespace, desired)
            emit("Normal", "DisruptionBudgetCreated",
                 f"PodDisruptionBudget {name}: maxUnavailable "
                 f"{spec.disruption['maxUnavailable']}")  # fmt: skip
        else:
            patch = builders.scaled_object_patch(desired, live)
            if patch:
                await k8s.patch(k8s.POD_DISRUPTION_BUDGETS, spec.namespace, name, patch)
        return True
    if exists is not False and await k8s.delete(k8s.POD_DISRUPTION_BUDGETS, spec.namespace, name):
        emit("Normal", "DisruptionBudgetDeleted", f"PodDisruptionBudget {name} removed")
    return False
