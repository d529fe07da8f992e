"""GET a health server's /healthz, /readyz or /metrics over real HTTP, never through a proxy."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url: str, timeout: float = 10.0) -> tuple[int, str, bytes]:
    """GET `url`; the status, content type and body, whatever the status."""
    try:
        with _OPENER.open(url, timeout=timeout) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


async def aget(port: int, path: str) -> tuple[int, Any]:
    """GET `path` on 127.0.0.1:`port` from a thread (the loop keeps running); the status, and
    the body decoded: JSON as data, anything else as text."""
    code, ctype, body = await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}{path}")
    return code, json.loads(body) if ctype == "application/json" else body.decode()
