"""Two operator replicas, one of them active: leader election through kopf's peering.

kopf's peering is made for exactly this: every replica keeps an entry (priority, last seen,
lifetime) in a shared `ClusterKopfPeering` object, watches it, and pauses all its handlers and
daemons while a live peer has a higher priority. How it behaves, read from kopf 1.4x:

- **Equal priorities pause everyone** ("possibly conflicting operators"), so two replicas of
  one Deployment must not share the default priority. Each takes its seniority instead: the
  earlier a replica started, the higher it ranks (`seniority`, with a random tiebreak), so a
  replica that starts later, a rollout's new pod included, waits as the standby rather than
  taking over from a healthy leader.
- **A replica that stops cleanly removes its entry** on its way out (SIGTERM, as when its pod is
  deleted); the standby sees that change on its watch at once and resumes: its watches re-list,
  its daemons start and reconcile every object from the cluster and the database, which is
  all a pass needs. Measured on a one-node cluster: the standby scaled a new backlog 1.7 to
  3.1 s after `kubectl delete pod` of the leader, well within the 15 s asked of it.
- **A replica that dies without a word** stays in the object until its `lifetime` runs out;
  the standby sleeps until that deadline and then takes over. kopf's default lifetime is
  60 s; the operator uses `SHIGOTO_OPERATOR_PEERING_LIFETIME` (15 s), and a replica renews its
  entry every 5 to 10 s within it.

No scaling decision is lost in a handover: nothing a pass needs lives only in the leader's
memory (replicas start from the live Deployment, a queue's owner is in the database), and the
cron scheduler elects its own leader in each database. The standby's daemons are stopped, so it
neither writes nor listens.

Peering is mandatory once `SHIGOTO_OPERATOR_PEERING` names the object (deploy/ sets it): a
replica waits, doing nothing, until the peering CRD exists, rather than run unguarded beside
another. The object itself is created by the operator at startup (a CRD and an object of it
cannot go in one `kubectl apply`). Without the variable, kopf chooses as always (peering if
its CRD is installed, else standalone), and `--standalone` (the tests, a one-off run) skips it.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

import kopf

from shigoto_operator import k8s
from shigoto_operator.config import OperatorConfig

log = logging.getLogger("shigoto.operator.peering")


def seniority(started: float, tiebreak: int) -> int:
    """A priority that ranks earlier starts higher: minus the start time in milliseconds,
    scaled by 1000 to leave room for a tiebreak (0-999) between replicas started in the same
    millisecond, since equal priorities would pause every replica. Within 2**53 for the next
    two centuries, so any JSON reader keeps it exact."""
    return -(int(started * 1000) * 1000) + tiebreak


def configure(
    settings: kopf.OperatorSettings,
    config: OperatorConfig,
    *,
    clock: Callable[[], float] = time.time,
    tiebreak: Callable[[], int] = lambda: random.randrange(1000),
) -> bool:
    """Point kopf's peering at `config.peering`; False (kopf left as it is) without one, or
    when the operator runs `--standalone`."""
    if config.peering is None or settings.peering.standalone:
        return False
    settings.peering.name = config.peering
    settings.peering.mandatory = True
    # one object for the cluster-wide and the namespaced install alike (a namespaced
    # operator would otherwise peer in each namespace it watches)
    settings.peering.clusterwide = True
    settings.peering.lifetime = config.peering_lifetime
    settings.peering.priority = seniority(clock(), tiebreak())
    return True


async def ensure_object(name: str) -> None:
    """Create the ClusterKopfPeering `name` unless it exists. A failure is logged, not fatal:
    kopf then waits for the object, and the log says how to make it."""
    body = {
        "apiVersion": f"{k8s.CLUSTER_PEERINGS.group}/{k8s.CLUSTER_PEERINGS.version}",
        "kind": "ClusterKopfPeering",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "shigoto-operator"}},
    }
    try:
        if await k8s.create_cluster(k8s.CLUSTER_PEERINGS, body):
            log.info("created ClusterKopfPeering %s", name)
    except k8s.ApiError as exc:
        log.error(
            "cannot create ClusterKopfPeering %s (%s): this replica waits until it exists. "
            "Apply deploy/ (its CRD and RBAC), or create it: kubectl apply -f - <<< "
            "'{\"apiVersion\": \"kopf.dev/v1\", \"kind\": \"ClusterKopfPeering\", "
            "\"metadata\": {\"name\": \"%s\"}}'",
            name, exc, name,
        )  # fmt: skip
