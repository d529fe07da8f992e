"""Cron expressions and their slots. Pure: no database, time passed in.

Standard 5-field cron as croniter reads it (day-of-month and day-of-week OR-ed when both are
restricted, out-of-range values rejected, never clamped), plus the `@hourly`-style aliases.
Slots are computed in the schedule's IANA time zone, so daylight-saving changes behave as a
person reading the expression expects: a slot in the hour skipped in spring runs once, right
after the gap; a fixed-time slot in the hour repeated in autumn runs once, at its first pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter

from shigoto.errors import ValidationError

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

CatchUp = Literal["latest", "all", "none"]
CATCH_UP_MODES = ("latest", "all", "none")


@dataclass(frozen=True, slots=True)
class CronSpec:
    expression: str
    fields: str
    timezone: str

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def next_after(self, moment: datetime) -> datetime:
        """The first slot strictly after `moment`, in UTC."""
        it = croniter(self.fields, moment.astimezone(self.zone))
        while True:
            slot = it.get_next(datetime).astimezone(UTC)
            if self._fires(slot):
                return slot

    def before(self, moment: datetime) -> Iterator[datetime]:
        """Slots strictly before `moment`, newest first, in UTC."""
        it = croniter(self.fields, moment.astimezone(self.zone))
        while True:
            slot = it.get_prev(datetime).astimezone(UTC)
            if self._fires(slot):
                yield slot

    def latest_at_or_before(self, moment: datetime) -> datetime:
        """The newest slot at or before `moment`, in UTC."""
        local = moment.astimezone(self.zone)
        if croniter.match(self.fields, local):
            slot = local.replace(second=0, microsecond=0).astimezone(UTC)
            if self._fires(slot):
                return slot
        return next(self.before(moment))

    def _fires(self, slot: datetime) -> bool:
        """False for the second pass of a fixed-time slot through a repeated (fall-back) hour.

        As in classic cron, `30 2 * * *` runs once on the day 02:30 happens twice; a minute or
        hour wildcard (`*/15 * * * *`, `30 * * * *`) runs in both passes, which are real hours.
        """
        minute, hour = self.fields.split()[:2]
        if minute.startswith("*") or hour.startswith("*"):
            return True
        wall = slot.astimezone(self.zone).replace(tzinfo=None)
        return wall.replace(tzinfo=self.zone, fold=0).astimezone(UTC) >= slot


def parse(expression: str, timezone: str = "UTC") -> CronSpec:
    """Validate an expression and a time zone; the error names the field and the fix."""
    if not isinstance(expression, str) or not expression.strip():
        raise ValidationError("schedule", "is empty; write 5 fields like '*/5 * * * *' or @hourly")
    text = " ".join(expression.split())
    fields = ALIASES.get(text.lower(), text)
    if fields.startswith("@"):
        raise ValidationError(
            "schedule", f"{expression!r} is not a known alias; use one of {', '.join(ALIASES)}"
        )
    if len(fields.split()) != 5:
        raise ValidationError(
            "schedule", f"{expression!r} has {len(fields.split())} fields; cron needs exactly 5: "
            "minute hour day-of-month month day-of-week",
        )  # fmt: skip
    if not croniter.is_valid(fields):
        raise ValidationError(
            "schedule", f"{expression!r} is not a valid cron expression (a value out of range, "
            "e.g. minute 0-59, hour 0-23, day 1-31, month 1-12, weekday 0-7)",
        )  # fmt: skip
    try:  # in range field by field, yet a date that never comes, like February 30
        croniter(fields, datetime(2000, 1, 1, tzinfo=UTC)).get_next(datetime)
    except CroniterBadDateError:
        raise ValidationError(
            "schedule", f"{expression!r} never fires: no month has that day; check the "
            "day-of-month and month fields",
        ) from None  # fmt: skip
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ValidationError(
            "timezone", f"{timezone!r} is not an IANA time zone (e.g. UTC, Europe/Oslo)"
        ) from None
    return CronSpec(expression=text, fields=fields, timezone=timezone)


def due_slots(
    spec: CronSpec,
    last_slot: datetime | None,
    now: datetime,
    catch_up: CatchUp = "latest",
    limit: int = 100,
) -> list[datetime]:
    """Slots to enqueue now, oldest first: those after `last_slot` and at or before `now`.

    A schedule never run before (`last_slot` None) starts with the slot that is due now, if
    any, and never reaches into the past. After downtime, `catch_up` decides how many missed
    slots run: only the newest ('latest'), all of them up to `limit` ('all', the newest
    `limit` when there are more), or none but the current one ('none').
    """
    newest = spec.latest_at_or_before(now)
    if last_slot is None:
        return [newest] if newest >= now.replace(second=0, microsecond=0) else []
    if newest <= last_slot:
        return []
    if catch_up == "latest":
        return [newest]
    if catch_up == "none":
        current = now.replace(second=0, microsecond=0)
        return [newest] if newest >= current else []
    # walk back from the newest: the cost is bounded by `limit`, not by the length of downtime
    slots = [newest]
    for slot in spec.before(newest):
        if slot <= last_slot or len(slots) >= limit:
            break
        slots.append(slot)
    slots.reverse()
    return slots


def slot_key(name: str, slot: datetime) -> str:
    """The unique key of one schedule's slot: the same slot is never enqueued twice."""
    return f"cron:{name}:{slot.astimezone(UTC).strftime('%Y-%m-%dT%H:%MZ')}"
