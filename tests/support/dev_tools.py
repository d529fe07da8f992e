"""The repository's dev tools (tools/), for the tests that check what they produce.

tools/ holds scripts run from the repository root, not a package on the import path (and a
namespace package called `tools` may come with the environment), so each is loaded from its
file under a name of its own.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load(name: str) -> ModuleType:
    """tools/`name`.py as a module (once per process)."""
    key = f"shigoto_dev_tools.{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, ROOT / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module  # before running it: dataclasses and typing look it up
    spec.loader.exec_module(module)
    return module


async_to_sync = load("async_to_sync")
