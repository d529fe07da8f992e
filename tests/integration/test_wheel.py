"""The built wheel carries its migrations: install it into a fresh venv and migrate with it.

The fresh venv gets only the shigoto wheel. Its dependencies (psycopg and friends) come from the
project's own venv through a `.pth` file, which appends that site-packages to the *end* of
sys.path: the fresh venv's own `shigoto` is always found first, and the repository is never on
the path. The migrate command runs outside the repository, so the checkout's `migrations/` folder
cannot be picked up by accident.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def run(
    cmd: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout}\n{result.stderr}"
    return result


def clean_env(**extra: str) -> dict[str, str]:
    """The caller's environment without anything that could point back at the repository."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SHIGOTO_"))}
    env.pop("VIRTUAL_ENV", None)
    return {**env, **extra}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(ROOT)])
    (built,) = out.glob("shigoto-*.whl")
    return built


@pytest.fixture(scope="module")
def fresh_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("venv") / "fresh"
    venv.EnvBuilder(with_pip=False, clear=True).create(home)
    python = home / "bin" / "python"
    # The project's pip installs into the fresh venv; no network, no dependencies.
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "--quiet", str(wheel)])  # fmt: skip
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(run([str(python), "-c", purelib], env=clean_env()).stdout.strip())
    (site / "zz_shigoto_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return home


def test_wheel_ships_every_migration(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        shipped = {Path(n).name for n in zf.namelist() if n.startswith("shigoto/migrations/")}
        entry_points = zf.read(
            next(n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt"))
        ).decode()
    assert shipped == {p.name for p in (ROOT / "migrations").glob("*.sql")}
    assert "shigoto = shigoto.cli:main" in entry_points


def test_installed_wheel_migrates_a_fresh_database(
    fresh_venv: Path, empty_db_url: str, tmp_path: Path
) -> None:
    python = fresh_venv / "bin" / "python"
    where = run(
        [str(python), "-c",
         "import shigoto, sys; m = sys.modules['shigoto.db.migrate'];"
         " print(shigoto.__file__); print(m.migrations_dir())"],
        cwd=tmp_path, env=clean_env(),
    ).stdout.split("\n")  # fmt: skip
    package_file, migrations = Path(where[0]), Path(where[1])
    assert package_file.is_relative_to(fresh_venv), package_file
    assert migrations.is_relative_to(fresh_venv), migrations

    result = run(
        [str(fresh_venv / "bin" / "shigoto"), "migrate"],
        cwd=tmp_path, env=clean_env(SHIGOTO_DATABASE_URL=empty_db_url),
    )  # fmt: skip
    assert "Traceback" not in result.stderr

    versions = sorted(int(p.name[:4]) for p in (ROOT / "migrations").glob("*.sql"))
    with psycopg.connect(empty_db_url) as conn:
        tables = {
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
            )
        }
        applied = [
            r[0] for r in conn.execute("SELECT version FROM shigoto_schema_migrations ORDER BY 1")
        ]
    assert {"shigoto_jobs", "shigoto_jobs_archive", "shigoto_nodes"} <= tables
    assert applied == versions
