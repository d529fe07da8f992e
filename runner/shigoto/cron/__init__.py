"""Cron: schedules kept in PostgreSQL, enqueued by the leader, one job per slot.

`shigoto.cron.schedule(...)` and friends are the documented Python API; the expression parser
lives in `expression`, the table and the leader's service in `scheduler`.
"""

from shigoto.cron.scheduler import (
    CronScheduler,
    Schedule,
    astore_one,
    aunschedule,
    build_schedule,
    load_file,
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
