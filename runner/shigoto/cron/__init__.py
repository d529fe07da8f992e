"""Cron: schedules kept in PostgreSQL, enqueued by the leader, one job per slot.

`shigoto.cron.schedule(...)` and friends are the documented Python API; the expression parser
lives in `expression`, what a schedule is in `definitions`, the table in `storage`, and the
leader's service in `scheduler`.
"""

from shigoto.cron.definitions import Schedule, build_schedule, load_file
from shigoto.cron.scheduler import CronScheduler
from shigoto.cron.storage import (
    astore_one,
    aunschedule,
    schedule,
    schedules,
    store,
    unschedule,
)

__all__ = [
    "CronScheduler",
    "Schedule",
    "astore_one",
    "aunschedule",
    "build_schedule",
    "load_file",
    "schedule",
    "schedules",
    "store",
    "unschedule",
]
