"""Human-readable output: tables for the terminal (:mod:`.tables`), a run's diagnostics (:mod:`.diagnostics`),
reports for sweeps (:mod:`.study`: :func:`report` picks the writer by the sweep's kind; :mod:`.sweep`: the dP study's).

The package itself imports nothing: ``plelab params`` reads a table without loading the statistics a sweep's report
needs. ``from plelab.reports import report, register_report`` still works (read from :mod:`.study` on first use).
"""

from __future__ import annotations

import importlib

_LAZY = {"report": "plelab.reports.study", "register_report": "plelab.reports.study"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'plelab.reports' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)


__all__ = ["register_report", "report"]
