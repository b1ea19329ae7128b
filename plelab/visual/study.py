"""The visual study on the sweep engine: one arm per way of keying the visual table, × seeds, paired.

Arms (``visual.ids``): ``none`` (no visual table: the baseline), ``dct-kmeans``, ``siglip-kmeans``,
``random`` (a null: i.i.d. IDs with dct-kmeans's frequencies) and ``oracle`` (the scenes' patch
labels: a positive control). Every arm of a seed shares the data, the frozen encoder, the LM's
initial weights and the batch order, so caption-loss differences are paired. The analysis compares
every arm with ``none`` on the caption loss and on the content-word loss (Holm within each family,
paired t + TOST against δ, :mod:`plelab.sweep.stats`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from plelab.sweep import stats
from plelab.sweep.results import SweepResults
from plelab.sweep.spec import Arm, SweepSpec

METHODS = ("none", "dct-kmeans", "siglip-kmeans", "random", "oracle")
DESCRIPTIONS = {"none": "no visual table (baseline)", "dct-kmeans": "DCT + K-means (offline)",
                "siglip-kmeans": "SigLIP-feature K-means (offline)", "random": "random IDs (null control)",
                "oracle": "patch labels (positive control)"}


@dataclass
class VisualProfile:
    preset: str
    seeds: int
    steps: int
    overrides: list[str] = field(default_factory=list)
    about: str = ""


VISUAL_PROFILES = {
    "quick": VisualProfile("cpu-tiny", 2, 40, ["visual.scenes=300", "visual.val_scenes=40", "visual.encoder_steps=30",
                                               "train.batch_size=16", "train.eval_every=10", "train.diag_every=0",
                                               "train.checkpoint_every=0", "train.warmup_steps=5"], "CI smoke test"),
    # 4 layers: a table injected after layer l is read by attention from layer l+1 on; with 2 layers the
    # oracle control barely moves the loss (tests/test_visual_train.py measures the positive control)
    "default": VisualProfile("cpu-tiny", 3, 800, ["visual.scenes=2000", "visual.val_scenes=200", "train.batch_size=32",
                                                  "model.num_hidden_layers=4", "train.eval_every=100",
                                                  "train.diag_every=100", "train.checkpoint_every=0",
                                                  "train.warmup_steps=20"], "≈ 40 s per run on 2 cores"),
}


def visual_spec(profile: str, methods=METHODS, dp: int = 16, seeds: int | None = None) -> SweepSpec:
    prof = VISUAL_PROFILES[profile]
    arms = [Arm(m, [f"visual.ids={m}"], family="visual" if m != "none" else "baseline", x=i,
                description=DESCRIPTIONS[m])
            for i, m in enumerate(methods)]
    return SweepSpec(preset=prof.preset, overrides=["visual.enabled=true", f"ple.dim={dp}", *prof.overrides], arms=arms,
                     seeds=list(range(seeds or prof.seeds)), steps=prof.steps, kind="visual", baseline="none")


def _paired(res: SweepResults, metric: str) -> list[stats.Comparison]:
    """Every method against ``none`` on ``metric`` (``caption`` = the run's loss, or ``content``)."""
    base, comps = res.spec.baseline, []
    others = [a.name for a in res.spec.arms if a.name != base and a.name in res.runs]

    def value(r):
        return r.loss if metric == "caption" else r.visual.get(metric, float("nan"))

    for arm in others:
        seeds = res.seeds_of(base, arm)
        if not seeds:
            continue
        diffs = [value(res.runs[arm][s]) - value(res.runs[base][s]) for s in seeds]
        comps.append(stats.paired(base, arm, diffs, res.spec.delta, res.spec.alpha, m=len(others)))
    return stats.family(comps, steps=False)


def visual_analysis(res: SweepResults) -> dict:
    rows = []
    for arm in res.spec.arms:
        runs = list(res.runs.get(arm.name, {}).values())
        if not runs:
            continue
        ids = runs[0].visual.get("id_metrics", {})

        def mean(key):
            return stats.mean_sd([r.visual.get(key, float("nan")) for r in runs])

        rows.append({"method": arm.name, "description": arm.description, "n": len(runs),
                     "nmi": ids.get("nmi"), "utilisation": ids.get("utilisation"), "perplexity": ids.get("perplexity"),
                     "caption": stats.mean_sd([r.loss for r in runs]), "content": mean("content"),
                     "template": mean("template"), "no_image_caption": mean("no_image_caption")})
    return {"rows": rows, "caption_vs_none": [c.to_dict() for c in _paired(res, "caption")],
            "content_vs_none": [c.to_dict() for c in _paired(res, "content")], "missing": res.missing}
