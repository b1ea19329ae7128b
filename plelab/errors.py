"""User-facing errors.

Every error a user can cause (bad config, bad corpus, bad checkpoint, bad CLI
argument) is raised as a :class:`PlelabError`. The CLI prints its message on one
line and exits with ``exit_code``; it never shows a traceback for these.
"""

from __future__ import annotations


class PlelabError(Exception):
    """An error caused by user input. ``str(err)`` is the one-line message."""

    exit_code = 2


class ConfigError(PlelabError):
    """An invalid configuration value, unknown key or unknown preset."""
