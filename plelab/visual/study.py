"""The visual study on the sweep engine: one arm per way of keying the visual table, × seeds, paired.

Arms (``visual.ids``): ``none`` (no visual table: the baseline), ``dct-kmeans``, ``siglip-kmeans``,
``random`` (a null: i.i.d. IDs with dct-kmeans's frequencies), ``oracle`` (the scenes' patch
labels: a positive control), and each online quantizer twice — ``vq-online`` / ``vq-frozen`` (and
lfq, bsq): trained during the run, or pretrained on the same stream and frozen, so that the harm
done by ID flips is separated from the missing loss-side pressure. Every arm of a seed shares the
data, the frozen encoder, the LM's initial weights and the batch order, so caption-loss differences
are paired. The analysis compares
every arm with ``none`` on the caption loss and on the content-word loss (Holm within each family,
paired t + TOST against δ, :mod:`plelab.stats`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from plelab.config.schema import QUANTIZER_IDS
from plelab.diagnostics.verdict import DELTA_USE, structure_verdict
from plelab import stats
from plelab.stats import blocked
from plelab.stats.analysis import verdict_counts
from plelab.sweeps.results import SweepResults, checkpoint_path
from plelab.sweeps.runner import RunJob
from plelab.sweeps.spec import Arm, SweepSpec
from plelab.visual.diagnostics import cross_seed

OFFLINE = ("none", "dct-kmeans", "siglip-kmeans", "random", "oracle")
MODES = {f"{q}-{mode}": (q, mode) for q in QUANTIZER_IDS for mode in ("online", "frozen")}  # arm -> (quantizer, mode)
ONLINE = tuple(MODES)
METHODS = OFFLINE + ONLINE
DESCRIPTIONS = {"none": "no visual table (baseline)", "dct-kmeans": "DCT + K-means (offline)",
                "siglip-kmeans": "SigLIP-feature K-means (offline)", "random": "random IDs (null control)",
                "oracle": "patch labels (positive control)",
                **{f"{q}-online": f"{q.upper()} trained during the run (IDs flip)" for q in QUANTIZER_IDS},
                **{f"{q}-frozen": f"{q.upper()} pretrained, then frozen (no flips)" for q in QUANTIZER_IDS}}


def method_overrides(method: str) -> list[str]:
    """The config overrides of one study arm: ``vq-online`` -> ``visual.ids=vq``, ``visual.online=true``."""
    if method in ONLINE:
        kind, mode = MODES[method]
        return [f"visual.ids={kind}", f"visual.online={'true' if mode == 'online' else 'false'}"]
    return [f"visual.ids={method}"]


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
    # plelab demo's visual part: the default's model at 3/8 of the steps and half the scenes
    "demo": VisualProfile("cpu-tiny", 3, 300, ["visual.scenes=1000", "visual.val_scenes=200", "train.batch_size=32",
                                               "model.num_hidden_layers=4", "train.eval_every=50",
                                               "train.diag_every=100", "train.checkpoint_every=0",
                                               "train.warmup_steps=20"], "≈ 50 s per run, two at a time on 2 cores"),
}


DESIGNS = ("tokenizers", "fix", "ablation")
GATE_ARMS = ("random", "oracle")  # the positive control and its null: plain arms that gate a study (positive_control)
# the five tokenizers of the seed, with frozen IDs (the fix needs targets that do not drift)
FIX_METHODS = ("none", "dct-kmeans", "siglip-kmeans", "vq-frozen", "lfq-frozen", "bsq-frozen")
ABLATION_METHODS = ("none", "dct-kmeans", "siglip-kmeans", "oracle")
LAMBDAS = (0.1, 0.5, 1.0)


def design_arms(design: str, methods, lambdas=LAMBDAS, plain=()) -> tuple[list[Arm], list[str]]:
    """The arms of one study design and the overrides every arm shares.

    ``tokenizers``: every method under the text-only loss, each paired with ``none``. ``fix`` (the
    2×2 of issue 8): per tokenizer the visual table on (λ = 0: the method's own arm; λ > 0: ``M.lvλ``,
    compared with ``M``) and off (``M.notable.lvλ``: the IDs are only targets, compared with ``none``;
    table off and λ = 0 is ``none`` itself). ``ablation``: continuous features withheld; per tokenizer the
    per-layer table (``M``, vs ``none``) and a layer-0 ID embedding of the same IDs (``M.layer0``, vs ``M``).
    ``random`` (the gate's null: fresh draws, nothing to fix or ablate) and the methods in ``plain`` are plain arms.
    """
    arms = [Arm(m, method_overrides(m), family="visual" if m != "none" else "baseline", x=i,
                description=DESCRIPTIONS[m]) for i, m in enumerate(methods)]
    shared: list[str] = []
    lambdas = list(dict.fromkeys(f"{lam:g}" for lam in lambdas))  # as in the arm names: 1 and 1.0 are one arm
    for i, m in enumerate(methods):
        if m in ("none", "random", *plain):
            continue
        if design == "fix":
            for lam in lambdas:
                arms.append(Arm(f"{m}.lv{lam}", [*method_overrides(m), f"visual.loss_weight={lam}"],
                                family=f"fix: table on, λ={lam}", x=i, reference=m,
                                description=f"{DESCRIPTIONS[m]}, L_text + {lam}·L_visual"))
                arms.append(Arm(f"{m}.notable.lv{lam}", [*method_overrides(m), "visual.table=false",
                                                        f"visual.loss_weight={lam}"],
                                family=f"fix: table off, λ={lam}", x=i, reference="none",
                                description=f"{DESCRIPTIONS[m]} as targets only, L_text + {lam}·L_visual"))
        elif design == "ablation":
            arms.append(Arm(f"{m}.layer0", [*method_overrides(m), "visual.injection=layer0"], family="layer-0 only",
                            x=i, reference=m, description=f"{DESCRIPTIONS[m]}, one layer-0 ID embedding"))
    if design == "ablation":
        shared.append("visual.features=false")
    return arms, shared


def visual_spec(profile: str, methods=METHODS, dp: int = 16, seeds: int | None = None, design: str = "tokenizers",
                lambdas=LAMBDAS, features: bool = True, preset: str | None = None, base: list[str] = (),
                overrides: list[str] = (), gate: bool = False) -> SweepSpec:
    """The study's :class:`SweepSpec`: on ``preset`` (default the profile's) with ``base`` overrides (a config
    file's, :func:`plelab.config.config_file_overrides`) below the study's own settings (dP, the profile, the
    design) and ``overrides`` above them. ``gate``: add the positive control and its null (``GATE_ARMS``) as
    plain arms, those of them ``methods`` lacks (a listed ``oracle`` keeps the design's cells)."""
    prof = VISUAL_PROFILES[profile]
    added = [m for m in GATE_ARMS if gate and m not in methods]
    arms, shared = design_arms(design, [*methods, *added], lambdas, plain=added)
    if not features and "visual.features=false" not in shared:
        shared.append("visual.features=false")
    return SweepSpec(preset=preset or prof.preset,
                     overrides=[*base, "visual.enabled=true", f"ple.dim={dp}", *prof.overrides, *shared, *overrides],
                     arms=arms, seeds=list(range(seeds or prof.seeds)), steps=prof.steps, kind="visual",
                     baseline="none")


def study_structure(jobs: list[RunJob], data_cache: dict) -> dict[int, dict]:
    """The visual study's cross-seed structure (the sweep's reader for kind ``visual``): both tables of every
    seed's final checkpoint."""
    return {seed: {"final": tables}
            for seed, tables in cross_seed({j.seed: checkpoint_path(j.path, j.cfg.train.steps) for j in jobs}).items()}


def _metric(run, metric: str) -> float:
    return run.loss if metric == "caption" else run.visual.get(metric, float("nan"))


def _values(res: SweepResults, metric: str) -> dict[str, dict[int, float]]:
    """arm -> seed -> ``metric`` (finite values only)."""
    return {arm: {s: v for s, r in by_seed.items() if math.isfinite(v := _metric(r, metric))}
            for arm, by_seed in res.runs.items()}


def paired_family(res: SweepResults, pairs: list[tuple[str, str]], metric: str) -> list[stats.Comparison]:
    """``b − a`` on ``metric`` (``caption`` = the run's loss, or a summary key) for each pair, paired by seed, as one
    family (:func:`plelab.stats.blocked.analyse_family`: seeds as blocks with a pooled error where the design holds,
    Dunnett when every pair shares its ``a``, else Holm; pairs without a common seed are left out)."""
    values = _values(res, metric)
    many_to_one = len(pairs) > 1 and len({a for a, _ in pairs}) == 1
    comps, _ = blocked.analyse_family(values, pairs, res.spec.delta, res.spec.alpha, steps=False,
                                      many_to_one=many_to_one)
    return comps


def interaction_family(values: dict[str, dict[int, float]], cells: list[tuple[str, str, str, str]], delta: float,
                       alpha: float) -> list[stats.Comparison]:
    """The fix's interaction for each cell ``(on_λ, on_0, off_λ, off_0)``, paired by seed, as one Holm family:

        I = [y(on_λ) − y(on_0)] − [y(off_λ) − y(off_0)]

    (what L_visual does with the visual table on, minus what it does with the table off), from the seeds all
    four arms ran (≥ 2). Each comparison's ``a`` names the table-off difference and ``b`` the table-on one, so
    its mean is ``b − a`` = I; labels as for any paired difference (a negative I: the fix helps more with the
    table than without it)."""
    items = []
    for on_l, on_0, off_l, off_0 in cells:
        arms = (on_l, on_0, off_l, off_0)
        if not all(a in values for a in arms):
            continue
        seeds = sorted(set.intersection(*(set(values[a]) for a in arms)))
        if len(seeds) < 2:
            continue
        diffs = [(values[on_l][s] - values[on_0][s]) - (values[off_l][s] - values[off_0][s]) for s in seeds]
        items.append((f"{off_l} − {off_0}", f"{on_l} − {on_0}", diffs))
    comps = [stats.paired(a, b, d, delta, alpha, m=len(items)) for a, b, d in items]
    stats.family(comps, steps=False)
    return comps


def fix_interactions(res: SweepResults, metric: str) -> dict[str, list[dict]]:
    """Per λ of the ``fix`` design: :func:`interaction_family` over the tokenizers (table off and λ = 0 is the
    no-table arm, ``res.spec.baseline``)."""
    values = _values(res, metric)
    cells: dict[str, list[tuple[str, str, str, str]]] = {}
    for arm in res.spec.arms:
        if arm.family.startswith("fix: table on, λ="):
            lam = arm.family.split("λ=")[1]
            cells.setdefault(lam, []).append((arm.name, arm.reference, f"{arm.reference}.notable.lv{lam}",
                                              res.spec.baseline))
    return {lam: [c.to_dict() for c in interaction_family(values, cs, res.spec.delta, res.spec.alpha)]
            for lam, cs in cells.items()}


def _paired(res: SweepResults, metric: str) -> list[stats.Comparison]:
    """Every method against ``none``."""
    base = res.spec.baseline
    return paired_family(res, [(base, a.name) for a in res.spec.arms if a.family == "visual" and a.name in res.runs],
                         metric)


def _avg(values) -> float:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(vals)) if vals else math.nan


def _layer_means(per_run: list[list | None]) -> list[float]:
    """Per layer, the mean over runs (runs without the metric left out)."""
    runs = [r for r in per_run if r]
    return [_avg([r[i] for r in runs]) for i in range(len(runs[0]))] if runs else []


def table_rows(res: SweepResults) -> list[dict]:
    """Per method and table (text, visual): the end-of-run diagnostics averaged over seeds, with both
    verdict axes counted over seeds (STRUCTURE from the cross-seed CKA, USE from the permute test)."""
    rows = []
    for arm in res.spec.arms:
        runs = [r for _, r in sorted(res.runs.get(arm.name, {}).items())]
        for table in ("text", "visual"):
            pairs = [(r, d) for r in runs if (d := r.visual.get("tables", {}).get(table)) and d.get("layers")]
            if not pairs:
                continue
            d0 = pairs[0][1]
            cs = [r.structure.get("final", {}).get(table) or {} for r, _ in pairs]
            perm = [d["use"]["permute"] for _, d in pairs]
            structure = [structure_verdict(c.get("cka"), c.get("null_mean"), c.get("null_sd"))[0] for c in cs]
            verdicts = [(st, d["use_verdict"]) for st, (_, d) in zip(structure, pairs)]
            disjoint = [st for st, c in zip(structure, cs) if c and c.get("independent", True)]  # cyclic pairs overlap
            rows.append({
                "method": arm.name, "table": table, "n": len(pairs), "rows": d0["rows"], "dim": d0["dim"],
                "rows_used": _avg([d["rows_used"] for _, d in pairs]),
                **{k: _avg([d["wt_mean"][k] for _, d in pairs]) for k in ("mean_cos", "erank_centred", "pc1")},
                **{f"{k}_null": d0["null"][k] for k in ("mean_cos", "erank_centred", "pc1")},
                "delta_erank": _avg([d["delta_mean"]["erank_centred"] for _, d in pairs]),
                "cka": _avg([c.get("cka") for c in cs]), "cka_null": _avg([c.get("null_mean") for c in cs]),
                "permute_caption": stats.mean_sd([p["caption"]["delta"] for p in perm]),
                "permute_content": stats.mean_sd([p["content"]["delta"] for p in perm]),
                "reset_caption": stats.mean_sd([d["use"]["reset"]["caption"]["delta"] for _, d in pairs]),
                "grad_row": _avg([r.signal.get(f"grad_row_{table}") for r, _ in pairs]),
                "grad_row_layers": _layer_means([r.signal.get(f"grad_row_{table}_layers") for r, _ in pairs]),
                "permute_caption_runs": [p["caption"]["delta"] for p in perm],
                "verdicts": [list(v) for v in verdicts], "structure_pairs": disjoint,
                "structure": verdict_counts(disjoint),
                "use": verdict_counts([u for _, u in verdicts])})
    return rows


def visual_analysis(res: SweepResults) -> dict:
    rows = []
    for arm in res.spec.arms:
        runs = list(res.runs.get(arm.name, {}).values())
        if not runs:
            continue
        ids = runs[0].visual.get("id_metrics", {})

        def mean(key):
            return stats.mean_sd([r.visual.get(key, float("nan")) for r in runs])

        flips = [r.visual.get("id_stability") or {} for r in runs]
        rows.append({"method": arm.name, "description": arm.description, "n": len(runs),
                     "flip_rate": _avg([f.get("flip_rate") for f in flips]),
                     "flip_chance": _avg([f.get("chance") for f in flips]),
                     "restart_flip_rate": _avg([f.get("restart_flip_rate") for f in flips]),
                     "codes_restarted": _avg([f.get("codes_restarted") for f in flips]), "nmi": ids.get("nmi"),
                     "utilisation": ids.get("utilisation"), "perplexity": ids.get("perplexity"),
                     "caption": stats.mean_sd([r.loss for r in runs]), "content": mean("content"),
                     "template": mean("template"), "no_image_caption": mean("no_image_caption"),
                     "visual_loss": mean("visual_loss")})
    cap, con = _paired(res, "caption"), _paired(res, "content")
    sensitivity = {f"{m} loss vs {res.spec.baseline}": stats.sensitivity(c, res.spec.delta, steps=False)
                   for m, c in (("caption", cap), ("content-word", con)) if c}
    tables = table_rows(res)
    return {"rows": rows, "tables": tables, "caption_vs_none": [c.to_dict() for c in cap],
            "content_vs_none": [c.to_dict() for c in con], "sensitivity": sensitivity,
            "online_vs_frozen": {m: [c.to_dict() for c in online_vs_frozen(res, m)] for m in ("caption", "content")},
            "references": {m: reference_families(res, m) for m in ("caption", "content")},
            "interactions": {m: fix_interactions(res, m) for m in ("caption", "content")},
            "gate": positive_control(res), "table_use": [c.to_dict() for c in table_use(tables, res.spec.alpha)],
            "missing": res.missing}


def reference_families(res: SweepResults, metric: str) -> dict[str, list[dict]]:
    """Every arm with a ``reference`` against it, paired by seed, Holm within each family (one λ, one
    switch): the fix's and the ablation's comparisons."""
    out: dict[str, list[dict]] = {}
    fams: dict[str, list[Arm]] = {}
    for arm in res.spec.arms:
        if arm.reference is not None and arm.name in res.runs and arm.reference in res.runs:
            fams.setdefault(arm.family, []).append(arm)
    for fam, arms in fams.items():
        out[fam] = [c.to_dict() for c in paired_family(res, [(a.reference, a.name) for a in arms], metric)]
    return out


def online_vs_frozen(res: SweepResults, metric: str) -> list[stats.Comparison]:
    """Per quantizer: online − frozen on ``metric``, paired by seed (Holm over the quantizers). Both arms
    end with the same quantizer, so the difference is what training on moving IDs cost."""
    pairs = [(f"{q}-frozen", f"{q}-online") for q in QUANTIZER_IDS
             if f"{q}-frozen" in res.runs and f"{q}-online" in res.runs]
    return paired_family(res, pairs, metric)


GATE_METRIC = "content"  # the positive control is judged where the image's facts are: the content words


def positive_control(res: SweepResults) -> dict:
    """The study's gate: the oracle (keyed by the scenes' own patch labels) against random IDs on the content-word
    loss, paired by seed. ``informative`` only if the oracle is lower by a significant margin not shown smaller than
    δ (label "significant drop"): a study whose best possible table does not beat a table that knows nothing cannot
    tell a useless tokenizer from a task with no room to help, so it is ``uninformative``; ``ungated`` when either
    arm is missing."""
    comps = paired_family(res, [("random", "oracle")], GATE_METRIC) if {"oracle", "random"} <= set(res.runs) else []
    if not comps or comps[0].n < 2:
        return {"status": "ungated", "comparison": None}
    c = comps[0]
    return {"status": "informative" if c.label == stats.DROP else "uninformative", "comparison": c.to_dict()}


def table_use(tables: list[dict], alpha: float) -> list[stats.Comparison]:
    """Is each visual table read, across seeds: every run's permute-rows caption-loss change (Δ > 0: the model
    reads the rows), one-sample t + TOST against ±``DELTA_USE`` (the USE verdict's floor), Holm over the tables.
    "significant rise" or "real rise smaller than δ": used; "equivalent within ±δ": dead (the seed's claim,
    measured); else inconclusive — no single run's verdict decides it."""
    items = [(t["method"], [d for d in t.get("permute_caption_runs", []) if d is not None and math.isfinite(d)])
             for t in tables if t["table"] == "visual"]
    comps = [stats.paired("rows in place", m, d, DELTA_USE, alpha, m=len(items)) for m, d in items]
    stats.family(comps, steps=False)
    return comps
