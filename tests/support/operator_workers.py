"""Workers for the runner processes the kubelet stand-in starts from the operator's manifests.

`shigoto run --import tests.support.operator_workers` (the Queue's `runner.imports`) imports
this module. Standard library only, like a user's worker package would be.
"""

from __future__ import annotations

import asyncio
import os

import shigoto


@shigoto.worker(queue="kube")
async def crunch(n: int, seconds: float = 0.2) -> dict[str, int]:
    """Takes a little while, so the work spreads over every runner pod that starts."""
    await asyncio.sleep(seconds)
    return {"n": n, "pid": os.getpid()}
