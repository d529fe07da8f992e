"""What a test does when a program of Debian's that pip cannot bring is missing."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def missing(message: str) -> NoReturn:
    """Fail as root, where `make test` installs the program, so its absence is a broken
    install; skip, saying how to install it, for a user who may not (make test told them which
    packages and why, and runs the rest of the suite)."""
    if os.geteuid() == 0:
        pytest.fail(message)
    pytest.skip(f"{message} (skipped: not root, so make test could not install it)")
