"""Operator-wide settings, read from the environment once at startup. Pure.

Per-queue behaviour lives in each Queue's spec; these are the few knobs of the operator
process itself, each with an env var so the operator Deployment can set it.

| setting | env var | default |
| --- | --- | --- |
| cron scheduler tick, per database | `SHIGOTO_OPERATOR_CRON_INTERVAL` | 1 s |
| CronSchedule status refresh | `SHIGOTO_OPERATOR_CRON_STATUS_INTERVAL` | 10 s |
| leader election retry, per database | `SHIGOTO_OPERATOR_LEADER_INTERVAL` | 2 s |
| wait before re-checking an invalid Queue | `SHIGOTO_OPERATOR_RETRY_INTERVAL` | 10 s |
| Prometheus `/metrics` port (0: off) | `SHIGOTO_OPERATOR_METRICS_PORT` | 9090 |
| address of that port | `SHIGOTO_OPERATOR_METRICS_HOST` | 0.0.0.0 |
| database probe for the metrics | `SHIGOTO_OPERATOR_METRICS_INTERVAL` | 15 s |
| dashboard of every known database (0: off) | `SHIGOTO_OPERATOR_DASHBOARD_PORT` | 0 |
| address of that port (port-forward reaches it) | `SHIGOTO_OPERATOR_DASHBOARD_HOST` | 127.0.0.1 |
| ClusterKopfPeering of the replicas (unset: kopf decides) | `SHIGOTO_OPERATOR_PEERING` | unset |
| seconds a silent replica counts as alive in it | `SHIGOTO_OPERATOR_PEERING_LIFETIME` | 15 |

The probe (reachability, oldest available job, live runners; see `metrics`) runs only while
the metrics are served.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)  # not slotted: from_env reads the class defaults
class OperatorConfig:
    cron_interval: float = 1.0
    cron_status_interval: float = 10.0
    leader_interval: float = 2.0
    retry_interval: float = 10.0
    #: Prometheus scrapes pods by their IP, so every interface by default; 0 turns it off.
    metrics_port: int = 9090
    metrics_host: str = "0.0.0.0"
    metrics_interval: float = 15.0
    #: Opt-in (docs/dashboard.md). Loopback by default (issue 24): `kubectl port-forward`
    #: reaches it there, and nothing else in the cluster can; set the host (0.0.0.0) to serve
    #: it through a Service, behind authentication of your own.
    dashboard_port: int = 0
    dashboard_host: str = "127.0.0.1"
    #: Leader election among replicas (`peering`): the ClusterKopfPeering they share, and how
    #: long a replica that stopped answering still counts (kopf's default is 60 s).
    peering: str | None = None
    peering_lifetime: int = 15

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> OperatorConfig:
        def seconds(name: str, default: float) -> float:
            text = env.get(name)
            if not text:
                return default
            try:
                value = float(text)
            except ValueError:
                raise ValueError(f"{name}: {text!r} is not a number of seconds") from None
            if value <= 0:
                raise ValueError(f"{name}: must be above 0, got {value}")
            return value

        def port(name: str, default: int) -> int:
            text = env.get(name)
            if not text:
                return default
            try:
                value = int(text)
            except ValueError:
                raise ValueError(
                    f"{name}: {text!r} is not a port number (0 turns it off)"
                ) from None
            if not 0 <= value <= 65535:
                raise ValueError(f"{name}: must be between 0 and 65535, got {value}")
            return value

        return cls(
            cron_interval=seconds("SHIGOTO_OPERATOR_CRON_INTERVAL", cls.cron_interval),
            cron_status_interval=seconds(
                "SHIGOTO_OPERATOR_CRON_STATUS_INTERVAL", cls.cron_status_interval
            ),
            leader_interval=seconds("SHIGOTO_OPERATOR_LEADER_INTERVAL", cls.leader_interval),
            retry_interval=seconds("SHIGOTO_OPERATOR_RETRY_INTERVAL", cls.retry_interval),
            metrics_port=port("SHIGOTO_OPERATOR_METRICS_PORT", cls.metrics_port),
            metrics_host=env.get("SHIGOTO_OPERATOR_METRICS_HOST") or cls.metrics_host,
            metrics_interval=seconds("SHIGOTO_OPERATOR_METRICS_INTERVAL", cls.metrics_interval),
            dashboard_port=port("SHIGOTO_OPERATOR_DASHBOARD_PORT", cls.dashboard_port),
            dashboard_host=env.get("SHIGOTO_OPERATOR_DASHBOARD_HOST") or cls.dashboard_host,
            peering=env.get("SHIGOTO_OPERATOR_PEERING") or None,
            peering_lifetime=int(
                seconds("SHIGOTO_OPERATOR_PEERING_LIFETIME", cls.peering_lifetime)
            ),
        )
