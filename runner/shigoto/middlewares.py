"""The old home of the shipped middlewares, kept so existing imports keep working.

They live in `shigoto.middleware.shipped` now, beside the registries they are registered in;
import `log_context` and `deadline` from `shigoto.middleware`.
"""

from __future__ import annotations

import warnings

from shigoto.middleware.shipped import *  # noqa: F403
from shigoto.middleware.shipped import __all__ as __all__

warnings.warn(
    "shigoto.middlewares is deprecated: import log_context and deadline from shigoto.middleware",
    DeprecationWarning,
    stacklevel=2,
)
