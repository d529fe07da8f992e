"""Cron expressions and their slots (pure: no database, time passed in)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

import shigoto
from shigoto.cron import expression as expr

OSLO = ZoneInfo("Europe/Oslo")


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


def forward(spec: expr.CronSpec, start: datetime, end: datetime) -> list[datetime]:
    """Every slot in (start, end], found by stepping forwards one slot at a time."""
    out = []
    moment = start
    while (moment := spec.next_after(moment)) <= end:
        out.append(moment)
    return out


# -- parsing --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression",
    ["* * * * *", "*/5 * * * *", "0 3 * * *", "0 0 1 * 1", "15,45 8-18 * 1-6 MON-FRI",
     "0 0 L * *", "  0   3  * * *  ", "0 12 * * 7", "0 0 29 2 *"],
)  # fmt: skip
def test_five_field_expressions_parse(expression: str) -> None:
    spec = expr.parse(expression)
    assert spec.fields.split() == expression.split()
    assert spec.expression == " ".join(expression.split())
    assert spec.timezone == "UTC"
    assert spec.next_after(utc(2030, 1, 1)) > utc(2030, 1, 1)


@pytest.mark.parametrize(
    ("alias", "fields"),
    [("@yearly", "0 0 1 1 *"), ("@annually", "0 0 1 1 *"), ("@monthly", "0 0 1 * *"),
     ("@weekly", "0 0 * * 0"), ("@daily", "0 0 * * *"), ("@midnight", "0 0 * * *"),
     ("@hourly", "0 * * * *"), ("@HOURLY", "0 * * * *"), (" @daily ", "0 0 * * *")],
)  # fmt: skip
def test_aliases_parse_to_their_five_fields(alias: str, fields: str) -> None:
    spec = expr.parse(alias, "Europe/Oslo")
    assert spec.fields == fields
    plain = expr.parse(fields, "Europe/Oslo")
    start = utc(2030, 1, 1, 12)
    assert spec.next_after(start) == plain.next_after(start)


def test_every_alias_is_covered() -> None:
    assert set(expr.ALIASES) == {
        "@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("expression", "hint"),
    [("0 3 * * 8", "out of range"), ("61 * * * *", "out of range"),
     ("0 24 * * *", "out of range"), ("0 0 32 * *", "out of range"),
     ("0 0 * 13 *", "out of range"), ("0 0 0 * *", "out of range"),
     ("a b c d e", "not a valid cron expression"),
     ("* * * *", "exactly 5"), ("* * * * * *", "exactly 5"), ("0 3 * * * 2030", "exactly 5"),
     ("*", "exactly 5"), ("@reboot", "not a known alias"), ("@every 5m", "not a known alias"),
     ("", "empty"), ("   ", "empty")],
)  # fmt: skip
def test_bad_expressions_raise_validation_error_naming_the_field(
    expression: str, hint: str
) -> None:
    with pytest.raises(shigoto.ValidationError) as excinfo:
        expr.parse(expression)
    assert excinfo.value.field == "schedule"
    assert hint in excinfo.value.message
    assert isinstance(excinfo.value, shigoto.Error)


@pytest.mark.parametrize("expression", ["0 0 30 2 *", "0 0 31 4 *", "0 0 31 2,4,6,9,11 *"])
def test_a_date_that_never_comes_is_rejected(expression: str) -> None:
    with pytest.raises(shigoto.ValidationError) as excinfo:
        expr.parse(expression)
    assert excinfo.value.field == "schedule"
    assert "never fires" in excinfo.value.message


def test_rare_but_real_dates_are_accepted() -> None:
    leap_day = expr.parse("0 0 29 2 *")
    assert leap_day.next_after(utc(2029, 1, 1)) == utc(2032, 2, 29)
    # February 30 or any Monday in February: fires on the Mondays
    assert expr.parse("0 0 30 2 1").next_after(utc(2030, 1, 1)) == utc(2030, 2, 4)


def test_a_non_string_expression_is_rejected() -> None:
    with pytest.raises(shigoto.ValidationError) as excinfo:
        expr.parse(None)  # type: ignore[arg-type]
    assert excinfo.value.field == "schedule"


@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "", "UTC+2", "../etc/passwd", "Europe/"])
def test_bad_time_zones_raise_validation_error_naming_the_field(zone: str) -> None:
    with pytest.raises(shigoto.ValidationError) as excinfo:
        expr.parse("0 3 * * *", zone)
    assert excinfo.value.field == "timezone"
    assert "IANA" in excinfo.value.message


def test_the_expression_is_checked_before_the_zone() -> None:
    with pytest.raises(shigoto.ValidationError) as excinfo:
        expr.parse("61 * * * *", "Nowhere/Land")
    assert excinfo.value.field == "schedule"


# -- slots ----------------------------------------------------------------------------------


def test_day_of_month_and_day_of_week_are_ored_when_both_are_restricted() -> None:
    spec = expr.parse("0 0 1 * 1")  # the 1st of the month, and every Monday
    slots = forward(spec, utc(2024, 1, 1), utc(2024, 3, 5))
    assert slots == [
        utc(2024, 1, 8), utc(2024, 1, 15), utc(2024, 1, 22), utc(2024, 1, 29),
        utc(2024, 2, 1),  # a Thursday: fires because it is the 1st
        utc(2024, 2, 5), utc(2024, 2, 12), utc(2024, 2, 19), utc(2024, 2, 26),
        utc(2024, 3, 1),  # a Friday
        utc(2024, 3, 4),
    ]  # fmt: skip
    assert {s.weekday() == 0 or s.day == 1 for s in slots} == {True}


def test_only_one_restricted_day_field_restricts_alone() -> None:
    mondays = forward(expr.parse("0 0 * * 1"), utc(2024, 1, 1), utc(2024, 2, 29))
    assert all(s.weekday() == 0 for s in mondays) and len(mondays) == 8
    firsts = forward(expr.parse("0 0 1 * *"), utc(2024, 1, 1), utc(2024, 4, 30))
    assert firsts == [utc(2024, 2, 1), utc(2024, 3, 1), utc(2024, 4, 1)]


def test_slots_follow_the_schedules_time_zone() -> None:
    spec = expr.parse("0 3 * * *", "Europe/Oslo")
    assert spec.next_after(utc(2024, 1, 10, 12)) == utc(2024, 1, 11, 2)  # 03:00 CET = 02:00Z
    assert spec.next_after(utc(2024, 7, 10, 12)) == utc(2024, 7, 11, 1)  # 03:00 CEST = 01:00Z
    assert spec.latest_at_or_before(utc(2024, 7, 11, 1, 0, 59)) == utc(2024, 7, 11, 1)
    assert spec.latest_at_or_before(utc(2024, 7, 11, 0, 59, 59)) == utc(2024, 7, 10, 1)


def test_dst_spring_forward_runs_a_slot_in_the_skipped_hour_once_right_after_the_gap() -> None:
    """Europe/Oslo jumps from 02:00 to 03:00 on 2024-03-31, so 02:30 does not exist that day.

    What happens: the daily 02:30 job runs once, at 03:00 local (01:00Z), the first moment after
    the gap; it is neither skipped nor doubled, and the next day it is back at 02:30 local.
    """
    spec = expr.parse("30 2 * * *", "Europe/Oslo")
    slots = forward(spec, utc(2024, 3, 29, 12), utc(2024, 4, 2, 12))
    assert slots == [utc(2024, 3, 30, 1, 30), utc(2024, 3, 31, 1, 0), utc(2024, 4, 1, 0, 30),
                     utc(2024, 4, 2, 0, 30)]  # fmt: skip
    local = [s.astimezone(OSLO) for s in slots]
    assert [(t.day, t.hour, t.minute) for t in local] == [
        (30, 2, 30),
        (31, 3, 0),
        (1, 2, 30),
        (2, 2, 30),
    ]
    assert len({expr.slot_key("daily", s) for s in slots}) == 4
    # catching up over the gap gives the same single slot for that day
    assert expr.due_slots(spec, utc(2024, 3, 30, 1, 30), utc(2024, 3, 31, 12), "all") == [
        utc(2024, 3, 31, 1, 0)
    ]
    assert spec.latest_at_or_before(utc(2024, 3, 31, 1, 5)) == utc(2024, 3, 31, 1, 0)


def test_dst_spring_forward_hourly_slots_skip_only_the_hour_that_does_not_exist() -> None:
    spec = expr.parse("30 * * * *", "Europe/Oslo")
    slots = forward(spec, utc(2024, 3, 30, 23), utc(2024, 3, 31, 3))
    local = [s.astimezone(OSLO).strftime("%H:%M%z") for s in slots]
    assert local == ["00:30+0100", "01:30+0100", "03:30+0200", "04:30+0200"]


def test_dst_fall_back_runs_a_fixed_time_slot_in_the_repeated_hour_once() -> None:
    """Europe/Oslo goes back from 03:00 to 02:00 on 2024-10-27: 02:30 happens twice.

    A daily 02:30 job runs once that day, at the first 02:30 (CEST, 00:30Z), as classic cron
    does for fixed-time jobs; a job whose minute or hour is a wildcard runs in both passes of
    the hour, because those really are distinct hours.
    """
    daily = expr.parse("30 2 * * *", "Europe/Oslo")
    slots = forward(daily, utc(2024, 10, 25, 12), utc(2024, 10, 28, 12))
    assert slots == [utc(2024, 10, 26, 0, 30), utc(2024, 10, 27, 0, 30), utc(2024, 10, 28, 1, 30)]
    assert daily.latest_at_or_before(utc(2024, 10, 27, 1, 45)) == utc(2024, 10, 27, 0, 30)
    assert expr.due_slots(daily, utc(2024, 10, 27, 0, 30), utc(2024, 10, 27, 1, 45)) == []
    assert expr.due_slots(daily, utc(2024, 10, 26, 0, 30), utc(2024, 10, 28, 12), "all") == [
        utc(2024, 10, 27, 0, 30), utc(2024, 10, 28, 1, 30)
    ]  # fmt: skip

    hourly = expr.parse("30 * * * *", "Europe/Oslo")
    slots = forward(hourly, utc(2024, 10, 26, 23), utc(2024, 10, 27, 3))
    local = [s.astimezone(OSLO).strftime("%H:%M%z") for s in slots]
    assert local == ["01:30+0200", "02:30+0200", "02:30+0100", "03:30+0100"]


@pytest.mark.parametrize(
    "expression", ["30 2 * * *", "30 * * * *", "*/15 * * * *", "0 3 * * *", "@daily", "0 1-3 * * *"]
)
@pytest.mark.parametrize(
    "window", [(utc(2024, 3, 29), utc(2024, 4, 2)), (utc(2024, 10, 25), utc(2024, 10, 29))]
)
def test_catching_up_agrees_with_stepping_forward_across_dst(
    expression: str, window: tuple[datetime, datetime]
) -> None:
    spec = expr.parse(expression, "Europe/Oslo")
    start, end = window
    expected = forward(spec, start, end)
    assert expr.due_slots(spec, start, end, "all", limit=10_000) == expected
    assert expr.due_slots(spec, start, end, "all", limit=3) == expected[-3:]
    assert expr.due_slots(spec, start, end, "latest") == expected[-1:]
    assert spec.latest_at_or_before(end) == expected[-1]


# -- due slots ------------------------------------------------------------------------------

EVERY_5 = expr.parse("*/5 * * * *")


def test_a_new_schedule_never_reaches_into_the_past() -> None:
    assert expr.due_slots(EVERY_5, None, utc(2030, 1, 1, 10, 7, 30)) == []
    assert expr.due_slots(EVERY_5, None, utc(2030, 1, 1, 10, 7, 30), "all") == []
    # ...but the slot of the current minute is due
    assert expr.due_slots(EVERY_5, None, utc(2030, 1, 1, 10, 5, 20), "all") == [
        utc(2030, 1, 1, 10, 5)
    ]
    assert expr.due_slots(EVERY_5, None, utc(2030, 1, 1, 10, 5)) == [utc(2030, 1, 1, 10, 5)]


def test_nothing_is_due_until_the_next_slot_comes() -> None:
    last = utc(2030, 1, 1, 10, 0)
    for catch_up in expr.CATCH_UP_MODES:
        assert expr.due_slots(EVERY_5, last, utc(2030, 1, 1, 10, 0, 30), catch_up) == []
        assert expr.due_slots(EVERY_5, last, utc(2030, 1, 1, 10, 4, 59), catch_up) == []
        assert expr.due_slots(EVERY_5, last, utc(2030, 1, 1, 10, 5), catch_up) == [
            utc(2030, 1, 1, 10, 5)
        ]


def test_latest_gives_only_the_newest_missed_slot() -> None:
    slots = expr.due_slots(EVERY_5, utc(2030, 1, 1, 10), utc(2030, 1, 1, 11, 2), "latest")
    assert slots == [utc(2030, 1, 1, 11, 0)]


def test_all_gives_every_missed_slot_oldest_first() -> None:
    slots = expr.due_slots(EVERY_5, utc(2030, 1, 1, 10), utc(2030, 1, 1, 11, 2), "all")
    assert slots == [utc(2030, 1, 1, 10, 5) + timedelta(minutes=5 * i) for i in range(12)]


def test_all_is_bounded_by_the_limit_keeping_the_newest() -> None:
    slots = expr.due_slots(EVERY_5, utc(2030, 1, 1, 10), utc(2030, 1, 1, 11, 2), "all", 5)
    assert slots == [utc(2030, 1, 1, 10, 40), utc(2030, 1, 1, 10, 45), utc(2030, 1, 1, 10, 50),
                     utc(2030, 1, 1, 10, 55), utc(2030, 1, 1, 11, 0)]  # fmt: skip
    one = expr.due_slots(EVERY_5, utc(2030, 1, 1, 10), utc(2030, 1, 1, 11, 2), "all", 1)
    assert one == [utc(2030, 1, 1, 11, 0)]
    exact = expr.due_slots(EVERY_5, utc(2030, 1, 1, 10), utc(2030, 1, 1, 11, 2), "all", 12)
    assert len(exact) == 12 and exact[0] == utc(2030, 1, 1, 10, 5)


def test_all_after_long_downtime_costs_only_the_limit() -> None:
    """A minutely schedule down for a year must not walk half a million slots."""
    spec = expr.parse("* * * * *")
    now = utc(2031, 1, 1, 0, 0, 30)
    slots = expr.due_slots(spec, utc(2030, 1, 1), now, "all", 100)
    assert slots == [utc(2031, 1, 1) - timedelta(minutes=99 - i) for i in range(100)]


def test_none_gives_only_a_slot_due_this_minute() -> None:
    last = utc(2030, 1, 1, 10)
    assert expr.due_slots(EVERY_5, last, utc(2030, 1, 1, 11, 2), "none") == []
    assert expr.due_slots(EVERY_5, last, utc(2030, 1, 1, 11, 0, 40), "none") == [
        utc(2030, 1, 1, 11, 0)
    ]


def test_slots_at_or_before_the_last_one_are_never_due_again() -> None:
    now = utc(2030, 1, 1, 11, 2)
    for catch_up in expr.CATCH_UP_MODES:
        assert expr.due_slots(EVERY_5, utc(2030, 1, 1, 11, 0), now, catch_up) == []
        # a clock that went backwards (last slot in the future) enqueues nothing either
        assert expr.due_slots(EVERY_5, utc(2030, 1, 1, 12, 0), now, catch_up) == []


# -- slot keys ------------------------------------------------------------------------------


def test_slot_key_is_stable_and_independent_of_the_zone_it_is_written_in() -> None:
    slot = utc(2030, 1, 1, 10, 5)
    assert expr.slot_key("report", slot) == "cron:report:2030-01-01T10:05Z"
    assert expr.slot_key("report", slot) == expr.slot_key("report", slot)
    assert expr.slot_key("report", slot.astimezone(OSLO)) == "cron:report:2030-01-01T10:05Z"


def test_slot_keys_differ_by_schedule_and_by_slot() -> None:
    slot = utc(2030, 1, 1, 10, 5)
    keys = {
        expr.slot_key("report", slot),
        expr.slot_key("report", slot + timedelta(minutes=5)),
        expr.slot_key("other", slot),
    }
    assert len(keys) == 3
