"""Who may do what on the dashboard, and the headers every answer carries. Pure.

Reading needs nothing, but a viewer without the token sees only the public part of each job
(`views.redact`: states, counts, ids, names, times, attempts, error classes). Acting (retry,
cancel, delete, pause, resume) needs the token, sent as `Authorization: Bearer <token>` and
compared in constant time. The token travels only in that header, never in a cookie or a URL:
a browser never attaches it on its own, so a cross-site form or image cannot carry it, which is
what makes the actions CSRF-safe by construction. Two more checks stop a request a browser
marks as cross-site before the token is even looked at: an `Origin` that is not this server's
own `Host`, and `Sec-Fetch-Site: cross-site`.

A dashboard bound to a loopback address also refuses a `Host` that is not a loopback name: a
page on another site whose name an attacker points at 127.0.0.1 (DNS rebinding) would
otherwise be same-origin with it.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from urllib.parse import urlsplit

from shigoto.errors import ConfigurationError

ENV_TOKEN = "SHIGOTO_DASHBOARD_TOKEN"
ENV_TOKEN_FILE = "SHIGOTO_DASHBOARD_TOKEN_FILE"
#: A token shorter than this is refused at start: it could be guessed over the network.
MIN_TOKEN_LENGTH = 16

SECURITY_HEADERS: dict[str, str] = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}

ENABLE_HINT = (
    f"actions are disabled: start the dashboard with {ENV_TOKEN} (or --token-file, e.g. a "
    "mounted Kubernetes Secret) to enable them"
)


class ShowArgs(StrEnum):
    """Who sees plain job args: everyone, a viewer with the token, or nobody."""

    ALWAYS = "always"
    TOKEN = "token"
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request may not act: the HTTP status and the message."""

    status: int
    message: str


def header(headers: Mapping[str, str], name: str) -> str | None:
    """A header's value whatever its case in `headers`."""
    lowered = name.lower()
    for key, value in headers.items():
        if key.lower() == lowered:
            return value
    return None


def bearer(headers: Mapping[str, str]) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, else None."""
    value = header(headers, "Authorization")
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who asks, as the views need it (`views.redact`): whether the request carries the
    dashboard's token, and whether it may see plain args under the `show_args` policy."""

    signed_in: bool
    may_see_args: bool
    policy: ShowArgs = ShowArgs.TOKEN


@dataclass(frozen=True, slots=True)
class Auth:
    """The configured token (None: read-only dashboard) and the args policy."""

    token: str | None = None
    show_args: ShowArgs = ShowArgs.TOKEN

    @property
    def actions_enabled(self) -> bool:
        return self.token is not None

    def authenticated(self, headers: Mapping[str, str]) -> bool:
        given = bearer(headers)
        if self.token is None or given is None:
            return False
        return hmac.compare_digest(given.encode(), self.token.encode())

    def may_see_args(self, headers: Mapping[str, str]) -> bool:
        if self.show_args == ShowArgs.ALWAYS:
            return True
        return self.show_args == ShowArgs.TOKEN and self.authenticated(headers)

    def viewer(self, headers: Mapping[str, str]) -> Viewer:
        """The viewer behind `headers`: every view of a job is cut to what it may see."""
        return Viewer(self.authenticated(headers), self.may_see_args(headers), self.show_args)

    def refuse_action(self, headers: Mapping[str, str]) -> Refusal | None:
        """Why a request may not act, or None when it may."""
        if cross_site(headers):
            return Refusal(403, "cross-origin request refused: actions are accepted only from "
                           "the dashboard's own page")  # fmt: skip
        if self.token is None:
            return Refusal(403, ENABLE_HINT)
        if bearer(headers) is None:
            return Refusal(401, "sign in: actions need the header Authorization: Bearer <token>")
        if not self.authenticated(headers):
            return Refusal(403, "wrong token")
        return None


def cross_site(headers: Mapping[str, str]) -> bool:
    """Whether the browser says the request comes from another site or origin."""
    if (header(headers, "Sec-Fetch-Site") or "").strip().lower() == "cross-site":
        return True
    origin = header(headers, "Origin")
    if origin is None:
        return False  # not sent by a browser's cross-origin fetch or form (curl, same-origin GET)
    host = (header(headers, "Host") or "").strip().lower()
    parts = urlsplit(origin.strip().lower())
    return origin.strip() == "null" or not host or parts.netloc != host


def loopback_host(host: str) -> bool:
    """Whether `host` (an address to bind, or a Host header's name) is this machine only."""
    name = host.strip().lower().strip("[]")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_name(host_header: str) -> str:
    """The name part of a Host header (`127.0.0.1:8080` -> `127.0.0.1`, `[::1]:80` -> `::1`)."""
    value = host_header.strip()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    return value.rpartition(":")[0] if value.count(":") == 1 else value


def load_token(token_file: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The token from `token_file` (a mounted Secret), else from SHIGOTO_DASHBOARD_TOKEN, else
    None; surrounding whitespace is trimmed (a Secret file often ends with a newline)."""
    env = os.environ if env is None else env
    path = token_file or env.get(ENV_TOKEN_FILE) or None
    if path:
        try:
            token = Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigurationError(
                f"--token-file / {ENV_TOKEN_FILE}: cannot read {path} ({exc.strerror or exc})"
            ) from None
        where = f"the token file {path}"
    else:
        token = (env.get(ENV_TOKEN) or "").strip()
        where = ENV_TOKEN
        if not token:
            return None
    if len(token) < MIN_TOKEN_LENGTH:
        raise ConfigurationError(
            f"{where}: the dashboard token must be at least {MIN_TOKEN_LENGTH} characters; "
            "make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    return token
