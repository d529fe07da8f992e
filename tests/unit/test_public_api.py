"""The public names of `shigoto` stay what `__init__` exports, whatever else gets imported."""

from __future__ import annotations

import importlib
import pkgutil

import shigoto


def test_importing_submodules_never_shadows_a_public_name() -> None:
    """`import shigoto.x` sets the attribute `x` on the package: a submodule named like a
    public function (say `health`) would replace that function for everyone in the process."""
    before = {name: getattr(shigoto, name) for name in shigoto.__all__}
    for module in pkgutil.walk_packages(shigoto.__path__, "shigoto."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    shadowed = sorted(
        name for name in shigoto.__all__ if getattr(shigoto, name) is not before[name]
    )
    assert shadowed == [], f"submodules replace public names: {shadowed}"
    assert callable(shigoto.health) and callable(shigoto.status)
