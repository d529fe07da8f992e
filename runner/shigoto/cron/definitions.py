"""What a cron schedule is: an entry validated before anything is stored, from Python
(`build_schedule`) or from the JSON file `shigoto run --cron FILE` reads (`load_file`).

Pure: nothing here touches the database, so a bad entry fails with a `ValidationError` naming
its field before any connection is borrowed.
"""

from __future__ import annotations

import difflib
import inspect
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from shigoto import jobspec
from shigoto.cron import expression as cron_expression
from shigoto.errors import ValidationError


@dataclass(frozen=True, slots=True)
class Schedule:
    """A validated cron entry, ready to store."""

    name: str
    expression: str
    worker: str
    args: dict[str, Any]
    timezone: str = "UTC"
    queue: str = "default"
    priority: int = 0
    max_attempts: int | None = None
    timeout: float | None = None
    tags: tuple[str, ...] = ()
    enabled: bool = True
    catch_up: cron_expression.CatchUp = "latest"
    catch_up_limit: int = 100


def build_schedule(
    name: str,
    expression: str,
    worker: Any,
    args: Mapping[str, Any] | None = None,
    *,
    timezone: str = "UTC",
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    timeout: float | timedelta | None = None,
    tags: list[str] | None = None,
    enabled: bool = True,
    catch_up: str = "latest",
    catch_up_limit: int = 100,
) -> Schedule:
    """Validate everything before anything is written; errors name the field."""
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise ValidationError("name", "a schedule needs a name of 1 to 200 characters")
    spec = cron_expression.parse(expression, timezone)
    job = jobspec.build(worker, args, queue=queue, priority=priority,
                        max_attempts=max_attempts, timeout=timeout, tags=tags)  # fmt: skip
    if catch_up not in cron_expression.CATCH_UP_MODES:
        raise ValidationError(
            "catch_up",
            f"must be one of {', '.join(cron_expression.CATCH_UP_MODES)}, got {catch_up!r}",
        )
    if (
        isinstance(catch_up_limit, bool)
        or not isinstance(catch_up_limit, int)
        or not (1 <= catch_up_limit <= 10_000)
    ):
        raise ValidationError("catch_up_limit", f"must be from 1 to 10000, got {catch_up_limit!r}")
    return Schedule(
        name=name, expression=spec.expression, worker=job.worker, args=json.loads(job.args_json),
        timezone=timezone, queue=job.queue, priority=job.priority, max_attempts=job.max_attempts,
        timeout=job.timeout, tags=tuple(job.tags), enabled=bool(enabled), catch_up=catch_up,  # type: ignore[arg-type]
        catch_up_limit=catch_up_limit,
    )  # fmt: skip


#: The keyword options of `build_schedule`, and the keys a `--cron` file entry may have.
OPTIONS = frozenset(
    name for name, p in inspect.signature(build_schedule).parameters.items()
    if p.kind is inspect.Parameter.KEYWORD_ONLY
)  # fmt: skip
FILE_KEYS = OPTIONS | {"name", "schedule", "expression", "worker", "args"}


def unknown_option(given: Mapping[str, Any], known: Iterable[str]) -> str | None:
    """Why `given` has a key that is not in `known` (with the closest known one: a typo such
    as `schedul` is the usual cause), or None. Checked before calling `build_schedule`, whose
    TypeError would name a function the user never called."""
    allowed = sorted(known)
    for key in given:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(allowed)}"
            return f"unknown key {key!r} ({hint})"
    return None


def load_file(path: str) -> list[Schedule]:
    """Read `shigoto run --cron FILE`: a JSON list of objects with `schedule`'s arguments."""
    try:
        with open(path, encoding="utf-8") as fh:
            entries = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise ValidationError("--cron", f"cannot read {path}: {exc}") from None
    if not isinstance(entries, list):
        raise ValidationError("--cron", f"{path} must hold a JSON list of schedules")
    out = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValidationError(f"--cron[{i}]", "must be an object")
        entry = dict(entry)
        if "timeZone" in entry:  # the CronSchedule resource's spelling
            entry.setdefault("timezone", entry.pop("timeZone"))
        unknown = unknown_option(entry, FILE_KEYS)
        if unknown:
            raise ValidationError(f"--cron[{i}]", f"{path}, entry {i} ({entry.get('name')!r}): "
                                  f"{unknown}")  # fmt: skip
        try:
            out.append(build_schedule(
                entry.pop("name", ""), entry.pop("schedule", entry.pop("expression", "")),
                entry.pop("worker", ""), entry.pop("args", None), **entry,
            ))  # fmt: skip
        except TypeError as exc:
            raise ValidationError(f"--cron[{i}]", str(exc)) from None
        except ValidationError as exc:
            raise ValidationError(f"--cron[{i}].{exc.field}", exc.message) from None
    return out
