"""Matplotlib for the reports' PNG figures, headless (the Agg backend), imported when a figure is drawn."""

from __future__ import annotations

from pathlib import Path

from plelab.io import atomic_write


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend."""
    import matplotlib  # heavy (~1 s with pyplot): only drawing a figure needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: as above

    return plt


def finish_axes(ax, xlabel: str, ylabel: str, title: str, legend: int | None = 8) -> None:
    """Label one panel; ``legend`` is the legend's font size (None: no legend)."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if legend is not None:
        ax.legend(fontsize=legend)


def save_figure(fig, path: Path) -> Path:
    """Lay out ``fig``, write it to ``path`` as a PNG atomically, close it; returns ``path``."""
    fig.tight_layout()
    atomic_write(path, lambda p: fig.savefig(p, dpi=100, format="png"))
    pyplot().close(fig)
    return path
