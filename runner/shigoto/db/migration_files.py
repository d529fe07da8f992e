"""The migration files and the steps they are cut into: pure, no database.

A migration is one file `NNNN_name.sql`. Lines `-- @step` cut it into steps, and each step
runs apart from the others, in order, so no lock is held from one step into the next:

- A step that builds or drops an index `CONCURRENTLY` runs outside any transaction (as
  PostgreSQL requires) and must be that one statement: the build takes no lock that blocks
  writes, however long the table. It must be re-runnable (`IF NOT EXISTS` / `IF EXISTS`):
  an interrupted build leaves an invalid index behind, which `migrate` drops before it
  builds again, and a step that finished may run again if the process died before it was
  recorded.
- Every other step runs in a transaction of its own, with a short `lock_timeout` and
  retries, and is recorded in that same transaction, so it runs exactly once even when a
  migration is interrupted between steps. A check that scans the table is added `NOT VALID`
  in one step and validated in a later one, where the scan holds no lock that writes wait
  behind.

A file without `-- @step` lines is one transactional step, as every migration was before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from shigoto.errors import MigrationError

_FILE_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_STEP_RE = re.compile(r"^-- @step\b.*$", re.MULTILINE)
_COMMENT_RE = re.compile(r"--[^\n]*")
_CONCURRENT_RE = re.compile(
    r"^\s*(CREATE\s+(UNIQUE\s+)?INDEX|DROP\s+INDEX|REINDEX\s+\w+)\s+CONCURRENTLY\b", re.I
)
_BUILD_RE = re.compile(
    r"^\s*CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+(\w+)\s", re.I
)
_DROP_RE = re.compile(r"^\s*DROP\s+INDEX\s+CONCURRENTLY\s+IF\s+EXISTS\s+\w+\s*;?\s*$", re.I)


@dataclass(frozen=True, slots=True)
class Step:
    """One part of a migration. `online` steps run outside a transaction; `index` names the
    index an online step builds, so an invalid leftover of an interrupted build can be
    dropped first."""

    sql: str
    online: bool = False
    index: str | None = None

    @property
    def summary(self) -> str:
        """The step's first statement line, for progress reports and `migrate --sql`."""
        code = _COMMENT_RE.sub("", self.sql)
        first = next((line.strip() for line in code.splitlines() if line.strip()), "")
        return first[:120]


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str
    steps: tuple[Step, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


def parse_steps(text: str, where: str) -> tuple[Step, ...]:
    """Cut a migration's text at its `-- @step` lines; `where` names the file in errors."""
    steps = []
    for number, chunk in enumerate(_STEP_RE.split(text), start=1):
        code = _COMMENT_RE.sub("", chunk).strip()
        if not code:
            continue
        if _CONCURRENT_RE.search(code):
            steps.append(_online_step(chunk, code, f"{where}, step {number}"))
        elif re.search(r"\bCONCURRENTLY\b", code, re.I):
            raise MigrationError(
                f"{where}, step {number}: CONCURRENTLY must begin the step's only statement; "
                "put a `-- @step` line before and after it"
            )
        else:
            steps.append(Step(chunk.strip() + "\n"))
    return tuple(steps)


def _online_step(chunk: str, code: str, where: str) -> Step:
    """Check an online step is one re-runnable statement, and name the index it builds."""
    if code.rstrip().rstrip(";").count(";") or "$$" in code:
        raise MigrationError(f"{where}: a CONCURRENTLY step must hold that one statement only")
    build = _BUILD_RE.match(code)
    if build:
        return Step(chunk.strip() + "\n", online=True, index=build[1])
    if _DROP_RE.match(code):
        return Step(chunk.strip() + "\n", online=True)
    raise MigrationError(
        f"{where}: write CREATE INDEX CONCURRENTLY IF NOT EXISTS <name> or "
        "DROP INDEX CONCURRENTLY IF EXISTS <name>, so the step can run again after an "
        "interrupted upgrade"
    )


def migrations_dir() -> Path:
    """The packaged copy inside a wheel, else the repository's `migrations/` (editable)."""
    packaged = Path(str(resources.files("shigoto"))) / "migrations"
    if packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parents[3] / "migrations"
    if checkout.is_dir():
        return checkout
    raise MigrationError(f"no migrations found in {packaged} or {checkout}: reinstall shigoto")


def load_migrations(directory: Path | None = None) -> list[Migration]:
    directory = directory or migrations_dir()
    found = []
    for path in sorted(directory.iterdir()):
        match = _FILE_RE.match(path.name)
        if match:
            text = path.read_text("utf-8")
            steps = parse_steps(text, path.name)
            found.append(Migration(int(match[1]), match[2], text, steps))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migrations share a version in {directory}: {versions}")
    return found


def latest_version() -> int:
    return max((m.version for m in load_migrations()), default=0)
