"""A Queue's connection budget: `spec.database.maxConnections` shared out among runner pods. Pure.

What one runner pod holds comes from the runner's own arithmetic
(`shigoto.runtime.connection_budget.runner_connections`), never a copy of it, so the operator
and the pods cannot disagree. The operator gives every pod the same share and puts it in the
pod's `SHIGOTO_MAX_CONNECTIONS`, so the pod really keeps to it:

    share = clamp(maxConnections // maxReplicas, least one pod works with, what one pod uses)
    pods  = maxConnections // share

Sharing by `maxReplicas` fits as many pods as autoscaling may ask for when the budget allows it
(smaller pools rather than fewer pods), and never squeezes a pod below the runner's minimum; a
budget that leaves room gives each pod no more than it would use uncapped. `hold` then keeps
the autoscaler's decision at or below `pods`, and says so with the reason `ConnectionBudget`.

Imports neither kopf, the Kubernetes client nor psycopg (`connection_budget` is arithmetic).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shigoto.runtime.connection_budget import minimum_connections, runner_connections
from shigoto_operator.policy import Decision
from shigoto_operator.spec import QueueSpec

CONNECTION_BUDGET = "ConnectionBudget"

#: A Queue's runner serves exactly one queue.
QUEUES_PER_POD = 1


@dataclass(frozen=True, slots=True)
class Budget:
    """`max_connections` shared as `per_pod` each: at most `max_pods` runner pods."""

    max_connections: int
    per_pod: int

    @property
    def max_pods(self) -> int:
        return self.max_connections // self.per_pod

    def describe(self) -> str:
        return (
            f"spec.database.maxConnections {self.max_connections} at {self.per_pod} per runner "
            f"pod allows {self.max_pods}"
        )

    def status(self, desired: int | None) -> dict[str, Any]:
        """`status.connectionBudget`: the numbers `kubectl describe queue` shows."""
        out = {
            "maxConnections": self.max_connections,
            "perPod": self.per_pod,
            "maxReplicas": self.max_pods,
        }
        if desired is not None:
            out["connections"] = desired * self.per_pod
        return out


def plan(spec: QueueSpec) -> Budget | None:
    """The Queue's budget, or None without `maxConnections`. `parse_queue` has refused a
    budget below the minimum, so every share here is one a runner accepts."""
    total = spec.database.max_connections
    if total is None:
        return None
    sessions = spec.database.sessions
    least = minimum_connections(sessions=sessions)
    uses = runner_connections(queues=QUEUES_PER_POD, max_connections=total, sessions=sessions)
    share = max(least, min(uses, total // spec.autoscaling.max_replicas))
    # the runner's own count for that cap: what the pod will really hold
    per_pod = runner_connections(queues=QUEUES_PER_POD, max_connections=share, sessions=sessions)
    return Budget(total, per_pod)


def hold(decision: Decision, budget: Budget | None, current: int) -> Decision:
    """`decision`, kept within the budget: never more than `budget.max_pods` replicas. When
    the budget is what holds the replicas, the reason is `ConnectionBudget` and the message
    gives the numbers."""
    if budget is None or decision.desired <= budget.max_pods:
        return decision
    desired = budget.max_pods
    verb = f"holding {current}" if desired == current else f"{current} → {desired}"
    message = (
        f"{verb} replicas, not the {decision.desired} autoscaling asks for: "
        f"{budget.describe()}; "
        f"{decision.message.split(': ', 1)[-1]}"
    )
    return dataclasses.replace(decision, desired=desired, reason=CONNECTION_BUDGET,
                               message=message)  # fmt: skip


def announce(
    held: str | None,
    emit: Callable[[str, str, str], None],
    decision: Decision | None,
    budget: Budget | None,
) -> str | None:
    """Post an Event when the budget starts holding the replicas below what autoscaling asks
    (or its numbers change while it does), not one per poll; returns what is held now, for
    the next call's `held`."""
    holding = decision is not None and decision.reason == CONNECTION_BUDGET
    key = budget.describe() if holding and budget is not None else None
    if key is not None and key != held and decision is not None:
        emit("Normal", CONNECTION_BUDGET, decision.message)
    return key
