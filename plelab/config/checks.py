"""The checks every config section validates with, and the field tags the sections share."""

from __future__ import annotations

from typing import get_args

from plelab.config.overrides import tags
from plelab.errors import ConfigError

_RESUME, _ADVISE, _DATA = tags("resume"), tags("advise"), tags("sweep_data")
_RESUME_ADVISE = tags("resume", "advise")
# A file-system path (a list: PATH:WEIGHT entries), made absolute when a run is created (plelab.config.paths).
_ADVISE_PATH = tags("advise", "path")
_PATH = tags("path")


def _require(cond: bool, key: str, value: object, allowed: str) -> None:
    if not cond:
        raise ConfigError(f"invalid config value {key}={value!r}: allowed {allowed}")


def _require_choice(value: object, key: str, choices) -> None:
    """``value`` must be one of a ``Literal`` type's choices."""
    allowed = get_args(choices)
    _require(value in allowed, key, value, " | ".join(allowed))
