"""The process-wide map from worker names to worker definitions.

It sits below both the client and the worker module so that enqueueing a worker object can
find its defaults without the client importing the worker layer (which imports the client for
its typed `.enqueue` shortcut). Only definitions register here, never job data: a runner
resolves a job's worker name against this map and imports nothing on a row's say-so.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import logging
import os
import pkgutil
import threading
import traceback
from collections.abc import Iterable, KeysView, Mapping
from typing import Any, Protocol

from shigoto.errors import ConfigurationError

log = logging.getLogger("shigoto.worker")


class Definition(Protocol):
    """What enqueueing needs to know about a worker: its name and enqueue defaults."""

    name: str

    def defaults(self) -> Mapping[str, Any]: ...


_definitions: dict[str, Any] = {}
_lock = threading.Lock()


def register(definition: Definition) -> None:
    """Add or replace `definition` under its name; the newest definition wins (a reload)."""
    with _lock:
        previous = _definitions.get(definition.name)
        if previous is not None and previous is not definition:
            log.debug("worker %s registered again; the newest definition wins", definition.name)
        _definitions[definition.name] = definition


def get(name: str) -> Any | None:
    return _definitions.get(name)


def contains(name: str) -> bool:
    return name in _definitions


def forget(name: str) -> None:
    """Drop a definition (tests that define throwaway workers)."""
    with _lock:
        _definitions.pop(name, None)


def names() -> KeysView[str]:
    return _definitions.keys()


def snapshot() -> dict[str, Any]:
    return dict(_definitions)


def import_worker_modules(modules: Iterable[str], origin: str = "imports") -> None:
    """Import the modules that define workers (`shigoto run --import`), or raise
    ConfigurationError in one line naming the module and the cause: a typo, a syntax error,
    a dependency that is not installed, an exception at import time.

    Called before anything touches the database, so a runner that could never run its jobs
    stops at once with the fix, rather than after connecting and migrating with a traceback
    25 lines long whose useful line is the last. `origin`: what the user wrote the modules in
    (`--import`, `SHIGOTO_IMPORT`), named by the message."""
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # everything an import can raise is the user's to fix
            raise ConfigurationError(f"{origin} {module}: {_import_problem(module, exc)}") from None


def _import_problem(module: str, exc: BaseException) -> str:
    """Why importing `module` failed, in one clause with where and how to fix it."""
    if isinstance(exc, ModuleNotFoundError) and exc.name and (
        module == exc.name or module.startswith(exc.name + ".")
    ):
        hint = _close_module(module)
        where = f"did you mean {hint}?" if hint else (
            f"is the project folder on PYTHONPATH? cwd is {os.getcwd()}")  # fmt: skip
        return f"no module named {exc.name!r} ({where})"
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return (f"needs module {exc.name!r}, which is not installed (imported at "
                f"{_user_frame(exc)}); install it in this environment")  # fmt: skip
    if isinstance(exc, SyntaxError):
        return f"SyntaxError at {_relative(exc.filename or '?')}:{exc.lineno}: {exc.msg}"
    return f"importing it raised {type(exc).__name__} at {_user_frame(exc)}: {exc}"


def _close_module(module: str) -> str | None:
    """A module next to where `module` was looked for whose name is close to it (a typo)."""
    parent, _, leaf = module.rpartition(".")
    try:
        found = importlib.util.find_spec(parent) if parent else None
    except Exception:
        return None
    if parent and (found is None or not found.submodule_search_locations):
        return None
    places = list(found.submodule_search_locations) if found else None  # type: ignore[union-attr]
    siblings = [m.name for m in pkgutil.iter_modules(places)] if places else []
    close = difflib.get_close_matches(leaf, siblings, n=1) if siblings else []
    return f"{parent}.{close[0]}" if close and parent else None


def _user_frame(exc: BaseException) -> str:
    """`file:line` of the innermost frame outside the import machinery: the user's line."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith("<frozen")]  # fmt: skip
    return f"{_relative(frames[-1].filename)}:{frames[-1].lineno}" if frames else "?"


def _relative(path: str) -> str:
    """`path` from the current directory when it lies below it: as the user knows it."""
    try:
        return os.path.relpath(path) if os.path.abspath(path).startswith(os.getcwd()) else path
    except ValueError:
        return path
