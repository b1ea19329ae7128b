"""The visual study's report (``SWEEP/report/``): the seed-style table — method, ID semantics (NMI),
ID utilisation and perplexity, caption loss and content-word loss against the no-table baseline
with paired CIs, Holm and the equivalence test — plus template-word loss and the loss with the image
removed, as Markdown, self-contained HTML, CSV and JSON, with one figure."""

from __future__ import annotations

import math
from pathlib import Path

from plelab.io import atomic_write, write_json
from plelab.report.sweep import to_html, to_markdown
from plelab.report.tables import csv_text, fmt
from plelab.sweep.results import collect
from plelab.visual.study import visual_analysis


def _ms(pair) -> str:
    m, sd = pair
    return "—" if not math.isfinite(m) else f"{m:.4f}" + (f" ± {sd:.4f}" if math.isfinite(sd) else "")


def _cmp(c: dict | None) -> str:
    if not c or c["ci_low"] is None:
        return "—" if not c else f"{c['mean']:+.4f} (n={c['n']})"
    return f"{c['mean']:+.4f} [{c['ci_low']:+.4f}, {c['ci_high']:+.4f}] {c['label']}"


def visual_table(analysis: dict) -> tuple[list[str], list[list[str]]]:
    cap = {c["b"]: c for c in analysis["caption_vs_none"]}
    con = {c["b"]: c for c in analysis["content_vs_none"]}
    head = ["method", "NMI (ID semantics)", "utilisation", "perplexity", "caption loss", "Δ caption vs none",
            "content-word loss", "Δ content vs none", "template-word loss", "caption loss, image removed"]
    rows = [[r["method"], fmt(r["nmi"], ".3f"), fmt(r["utilisation"], ".3f"), fmt(r["perplexity"], ".1f"),
             _ms(r["caption"]), _cmp(cap.get(r["method"])), _ms(r["content"]), _cmp(con.get(r["method"])),
             _ms(r["template"]), _ms(r["no_image_caption"])] for r in analysis["rows"]]
    return head, rows


def _plot(analysis: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = analysis["rows"]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["content"][0] for r in rows], 0.4, label="content words")
    ax.bar([x + 0.2 for x in xs], [r["template"][0] for r in rows], 0.4, label="template words")
    ax.set_xticks(list(xs), [r["method"] for r in rows], fontsize=8)
    ax.set_ylabel("caption loss (nats / word), mean over seeds")
    ax.set_title("caption loss by visual-ID method")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "visual_losses.png"
    atomic_write(path, lambda p: fig.savefig(p, dpi=100, format="png"))
    plt.close(fig)
    return path


def write_visual_report(root: str | Path) -> list[Path]:
    root = Path(root)
    res = collect(root, structure=False)
    analysis = visual_analysis(res)
    out = root / "report"
    (out / "plots").mkdir(parents=True, exist_ok=True)
    plot = _plot(analysis, out / "plots")
    spec, cfg = res.spec, res.configs[res.spec.baseline]
    v, t = cfg["visual"], cfg["train"]
    blocks = [("h1", f"plelab visual study — {root.name}"),
              ("p", f"Preset {spec.preset}, dP={cfg['ple']['dim']}, K={v['k']} visual IDs, "
                    f"{v['scenes']} training scenes ({v['image_size']}² px, {v['patch']}² patches), "
                    f"{t['steps']} steps × {t['batch_size']} captions, seeds {spec.seeds}; text-only (caption) "
                    "loss. Every arm of a seed "
                    "shares data, encoder, initial LM and batch order: differences are paired. δ = "
                    f"{spec.delta} nats; labels after Holm over the methods."),
              ("h2", "Results"), ("table", *visual_table(analysis)),
              ("p", "NMI is computed on held-out patches against the generator's labels (colour × shape × size); "
                    "the caption loss with the image removed shows how much the image helps at all."),
              ("img", plot)]
    if res.missing:
        blocks.insert(2, ("p", f"**{len(res.missing)} run(s) unfinished**: rerun the study to finish them."))
    head, rows = visual_table(analysis)
    return [atomic_write(out / "report.md", lambda p: p.write_text(to_markdown(blocks, out))),
            atomic_write(out / "report.html",
                         lambda p: p.write_text(to_html(blocks, f"plelab visual study {root.name}"))),
            atomic_write(out / "results.csv", lambda p: p.write_text(csv_text(head, rows))),
            write_json(out / "results.json", {"spec": spec.to_dict(), "analysis": analysis})]
