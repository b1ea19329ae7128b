"""Matplotlib for the reports' PNG figures, headless (the Agg backend), imported when a figure is drawn."""

from __future__ import annotations


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend."""
    import matplotlib  # heavy (~1 s with pyplot): only drawing a figure needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: as above

    return plt
