"""Draw docs/ple.png, the README's picture of PLE in a decoder (docs/ple.md §1.2–1.4).

    python scripts/ple_figure.py [OUT.png]      # default: docs/ple.png next to this repo's docs
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

TABLE, TRUNK, BRANCH, INPUT = "#f6c48a", "#cfd8e3", "#a9d6b4", "#ffffff"


def box(ax, x, y, w, h, text, color, size=10, bold=False):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08", fc=color, ec="#333333",
                                lw=1.0, zorder=2))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, zorder=4,
            fontweight="bold" if bold else "normal")


def arrow(ax, start, end, color="#333333", style="-|>", rad=0.0, behind=False):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12, color=color, lw=1.1,
                                 connectionstyle=f"arc3,rad={rad}", zorder=1 if behind else 3))


def layer(ax, x, y, label):
    """One decoder layer: attention and MLP on the stream, then the PLE branch as a third residual update."""
    ax.add_patch(FancyBboxPatch((x, y), 6.3, 1.5, boxstyle="round,pad=0.02,rounding_size=0.1", fc="#f4f4f4",
                                ec="#777777", lw=0.8, ls="--", zorder=0))
    ax.text(x + 6.2, y + 1.62, label, fontsize=9, color="#555555", ha="right")
    box(ax, x + 0.15, y + 0.45, 1.1, 0.6, "Attn", TRUNK)
    box(ax, x + 1.45, y + 0.45, 1.1, 0.6, "MLP", TRUNK)
    box(ax, x + 2.85, y + 0.45, 3.25, 0.6, r"RMSNorm$(W_p^l\,(\mathrm{gelu}(W_g^l h)\odot P_l))$", BRANCH, size=9)
    arrow(ax, (x + 1.25, y + 0.75), (x + 1.45, y + 0.75))
    arrow(ax, (x + 2.55, y + 0.75), (x + 2.85, y + 0.75))
    ax.text(x + 5.2, y + 0.12, r"$h \leftarrow h\, +$ branch", ha="center", fontsize=8, color="#555555")


def draw(out: Path) -> None:
    fig, ax = plt.subplots(figsize=(11, 5.2))
    ax.set_xlim(0, 15.4)
    ax.set_ylim(0, 7.4)
    ax.axis("off")

    # model level: the per-layer inputs P from the table and the main embedding
    box(ax, 0.2, 5.9, 2.2, 0.7, "token ids $x$", INPUT)
    box(ax, 0.2, 3.2, 2.2, 1.0, "main embedding\n$e = \\sqrt{H}\\,E[x]$", TRUNK)
    box(ax, 2.9, 5.75, 2.9, 1.0, "table $T$  $[V_p,\\ L\\cdot d_P]$\nrow $x$, times $\\sqrt{d_P}$", TABLE)
    box(ax, 2.9, 3.2, 2.9, 1.0, "$W_m e/\\sqrt{H}$, split in $L$,\nRMSNorm over $d_P$", TRUNK)
    box(ax, 6.2, 4.45, 1.2, 0.9, "$(c+z)/\\sqrt{2}$", INPUT)
    box(ax, 6.05, 1.25, 1.5, 1.4, "$P$\n$[B,T,L,d_P]$\none slice\nper layer", TABLE, size=9)
    arrow(ax, (2.4, 6.25), (2.9, 6.25))
    arrow(ax, (2.4, 3.7), (2.9, 3.7))
    arrow(ax, (1.3, 5.9), (1.3, 4.2))
    ax.text(1.4, 5.0, "embed", fontsize=8, color="#555555")
    arrow(ax, (5.8, 6.25), (6.6, 5.35), rad=-0.2)
    ax.text(6.0, 6.35, "$z$", fontsize=10)
    arrow(ax, (5.8, 3.7), (6.6, 4.45), rad=0.2)
    ax.text(6.0, 3.45, "$c$", fontsize=10)
    arrow(ax, (6.8, 4.45), (6.8, 2.65))

    # the decoder: L layers, each reading its own slice P_l
    x0 = 8.6
    layer(ax, x0, 5.2, "layer 0")
    layer(ax, x0, 2.95, "layer 1")
    ax.text(x0 + 3.15, 2.35, "⋮", ha="center", fontsize=16)
    layer(ax, x0, 0.3, "layer $L-1$")
    arrow(ax, (x0 + 0.7, 7.25), (x0 + 0.7, 6.25))  # the stream h enters layer 0 as the main embedding
    ax.text(x0 + 0.85, 6.95, "$h = e$", fontsize=9, color="#555555")
    arrow(ax, (x0 + 0.7, 5.65), (x0 + 0.7, 4.0))
    arrow(ax, (x0 + 0.7, 3.4), (x0 + 0.7, 2.55))
    arrow(ax, (x0 + 0.7, 2.15), (x0 + 0.7, 1.35))
    for y, tag, rad in ((5.2, "$P_0$", 0.0), (2.95, "$P_1$", 0.0), (0.3, "$P_{L-1}$", 0.25)):
        arrow(ax, (7.55, 1.95), (x0 + 3.2, y + 0.43), color="#c77d1a", rad=rad, behind=True)
        ax.text(x0 + 3.3, y + 0.12, tag, fontsize=9, color="#c77d1a", ha="left", va="bottom")
    ax.text(0.2, 0.5, "Gemma 3n / Gemma 4 PLE (plain, no-AltUp form): the equations are in docs/ple.md",
            fontsize=8, color="#555555")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    draw(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "docs" / "ple.png")
