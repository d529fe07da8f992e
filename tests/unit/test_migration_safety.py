"""Every migration can run while the queue runs, and code of the previous release keeps working
on the schema it leaves (issue 23). Read from the SQL files, before any database is involved:
a new migration that would hold writes for as long as its table is big fails here.
"""

from __future__ import annotations

import re

import pytest

from shigoto.db.migration_files import Migration, load_migrations

MIGRATIONS = load_migrations()
_BODY = re.compile(r"\$(\w*)\$.*?\$\1\$", re.S)  # function bodies and DO blocks
_COMMENT = re.compile(r"--[^\n]*")


def statements(m: Migration) -> list[tuple[bool, str]]:
    """(step is online, statement) for each top-level statement, bodies blanked out."""
    found = []
    for step in m.steps:
        code = _BODY.sub("$$ $$", _COMMENT.sub("", step.sql))
        found += [(step.online, " ".join(s.split())) for s in code.split(";") if s.strip()]
    return found


def created_here(m: Migration) -> set[str]:
    """Tables the migration creates: empty when it changes them, so anything goes."""
    return set(re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)", m.sql, re.I))


def later_than_first(m: Migration) -> bool:
    return m.version > 1


@pytest.mark.parametrize("m", [m for m in MIGRATIONS if later_than_first(m)], ids=lambda m: m.label)
def test_indexes_on_existing_tables_are_built_concurrently(m: Migration) -> None:
    for online, statement in statements(m):
        index = re.match(r"CREATE (?:UNIQUE )?INDEX (CONCURRENTLY )?.*? ON (?:ONLY )?(\w+)",
                         statement, re.I)  # fmt: skip
        if index and index[2] not in created_here(m):
            assert index[1] and online, (
                f"{m.label}: build it CONCURRENTLY in its own step: {statement}"
            )


@pytest.mark.parametrize("m", [m for m in MIGRATIONS if later_than_first(m)], ids=lambda m: m.label)
def test_checks_on_existing_tables_are_added_not_valid(m: Migration) -> None:
    """A check added valid scans the table under its strongest lock; NOT VALID then VALIDATE
    (in a later step) scans it under a lock writes do not wait for. Settings tables hold a
    row per queue or schedule: a scan of them is instant."""
    small = {"shigoto_queues", "shigoto_cron"}
    for _, statement in statements(m):
        added = re.match(
            r"ALTER TABLE (\w+) ADD CONSTRAINT \w+ (CHECK|FOREIGN KEY)", statement, re.I
        )
        if added and added[1] not in created_here(m) | small:
            assert statement.upper().endswith("NOT VALID"), f"{m.label}: {statement}"


@pytest.mark.parametrize("m", [m for m in MIGRATIONS if later_than_first(m)], ids=lambda m: m.label)
def test_no_change_takes_away_what_the_previous_release_uses(m: Migration) -> None:
    """Expand, then contract: a migration adds; dropping, renaming or retyping a column of
    the job tables, or making one NOT NULL, would break runners and services of the previous
    release during a rolling update (and rewrite or scan the table under its lock)."""
    jobs_tables = {"shigoto_jobs", "shigoto_jobs_archive"}
    for _, statement in statements(m):
        altered = re.match(r"ALTER TABLE (\w+) (.*)", statement, re.I)
        if not altered or altered[1] not in jobs_tables:
            continue
        change = altered[2].upper()
        for forbidden in ("DROP COLUMN", "RENAME", " TYPE ", "SET NOT NULL"):
            assert forbidden not in f" {change} ", f"{m.label}: {statement}"
        if "ADD COLUMN" in change and "NOT NULL" in change:
            assert "DEFAULT" in change, f"{m.label}: a NOT NULL column needs a default: {statement}"
