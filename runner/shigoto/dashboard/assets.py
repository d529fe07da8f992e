"""The page's static files (`static/`, shipped inside the package): finding one safely.

Only regular files under the static directory are served. A request path is percent-decoded
once by the caller; here any `..` or `.` segment, a backslash, a NUL or an empty segment is
refused before the file system is asked, and the resolved path (symlinks followed) must still
lie under the directory. Directories are never listed. Content types are fixed for the files a
page uses: with `X-Content-Type-Options: nosniff`, a module script served as text/plain would
not run, and the system's mime table is not always complete.
"""

from __future__ import annotations

import mimetypes
from dataclasses import dataclass
from pathlib import Path

STATIC_DIR = Path(__file__).parent / "static"

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".woff2": "font/woff2",
    ".txt": "text/plain; charset=utf-8",
    ".map": "application/json",
}


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    content_type: str


def content_type(path: Path) -> str:
    known = _TYPES.get(path.suffix.lower())
    if known:
        return known
    guessed, _ = mimetypes.guess_type(path.name)
    return guessed or "application/octet-stream"


def find(root: Path, relative: str) -> Asset | None:
    """The file at `relative` (already percent-decoded, '/'-separated) under `root`, or None."""
    if not relative or "\\" in relative or "\x00" in relative:
        return None
    segments = relative.split("/")
    if any(s in ("", ".", "..") for s in segments):
        return None
    base = root.resolve()
    try:
        path = base.joinpath(*segments).resolve()
    except (OSError, RuntimeError):
        return None
    if not path.is_relative_to(base) or not path.is_file():
        return None
    try:
        return Asset(path.read_bytes(), content_type(path))
    except OSError:
        return None
