"""``plelab demo``: the seed's parameter table, then a paired multi-seed dP study on the embedded
corpus with its diagnostics and report.

1. Exact PLE accounting of the seed's 3B model for dP in {0, 64, 128, 256, 512}.
2. The embedded corpus (Python's own documentation), a BPE tokenizer trained on it, and the
   validation split's unigram entropy (the loss a context-free model cannot beat).
3. A sweep (``plelab.sweeps``): every dP arm × seeds, paired (same data order and initial trunk per
   seed), the diagnostics at an early and the final checkpoint, then the report.
4. Visual PLE in brief (``plelab.visual.study``, design ``fix``): no visual table, a DCT + K-means
   visual table, the same with the visual next-token loss (λ = 0.5), and the IDs as targets only; the oracle and
   random IDs gate the findings (``positive_control``).

Profiles: the default takes 11–21 minutes on a 2-core CPU (the machines vary); ``--quick`` is the CI smoke test
(≤ 2 minutes); ``--study`` is a real CPU study at the seed's dP/H ratios (days); ``--study-gpu`` one on one GPU.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from plelab.config import resolve_config
from plelab.data.pipeline import prepare_token_data
from plelab.errors import ConfigError
from plelab.io import write_json
from plelab.model.accounting import account
from plelab.reports.sweep import write_report
from plelab.reports.tables import accounting_tables
from plelab.runtime import available_cores
from plelab.sweeps.commands import dp_spec
from plelab.scaling.fit_ladder import FitLadder, ladder_specs
from plelab.sweeps.runner import run_sweep, say, study_estimate
from plelab.scaling.scaling_runs import fit_runs, fit_text
from plelab.sweeps.spec import CONTROLS, load_spec, merge_spec
from plelab.visual.report import write_visual_report
from plelab.visual.study import VISUAL_PROFILES, visual_spec


@dataclass
class Profile:
    preset: str
    dims: list[int]
    seeds: int
    steps: int
    controls: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    about: str = ""
    visual: bool = False  # the visual PLE part after the dP study
    corpus: str = "stdlib"  # data.embedded when no --data is given
    ladder: FitLadder | None = None  # the rungs added for a scaling fit of the study (plelab fit)


PROFILES = {
    "default": Profile("cpu-sweep", [0, 8, 32], 3, 240, visual=True,
                       about="5–10 minutes on 2 CPU cores, then 5–9 for the visual part"),
    "quick": Profile("cpu-tiny", [0, 8, 16], 3, 60, overrides=["train.early_checkpoint=20", "train.diag_every=10",
                                                                 "train.checkpoint_every=0"], about="≤ 2 minutes",
                     visual=True),
    # the seed's dP/H ratios 0.025 / 0.05 / 0.1 / 0.2 at H = 160, every control
    "study": Profile("cpu-sweep-h160", [0, 4, 8, 16, 32], 6, 2000, controls=list(CONTROLS),
                     overrides=["train.eval_every=100", "train.early_checkpoint=400", "train.checkpoint_every=500",
                                "train.diag_every=100", "train.warmup_steps=100"],
                     about="the seed's dP/H ratios, ≈200 runs of 2,000 steps: about two days on 2 cores, resumable"),
    # past the toy regime: 20 tokens per trunk parameter, Gemma's gate and the seed's, the iid and zero controls
    "long": Profile("cpu-long-h160", [0, 4, 8, 16, 32], 3, 2300, controls=["iid", "zero", "gate-scalar"],
                    corpus="packages", ladder=FitLadder(hidden=(40, 80, 120, 160), steps=(575, 1150, 2300), ratio=0.1),
                    about="a 0.46 M trunk to 20 tokens per parameter, 17 arms × 3 seeds, then a 4 × 3 fit ladder: "
                          "≈ 7 hours measured on 2 cores, resumable"),
    "study-gpu": Profile("gpu-125m", [0, 32, 64, 128, 256], 3, 5000,
                         controls=["frozen", "zero", "iid", "matched", "boost"],
                         overrides=["train.early_checkpoint=1000", "train.checkpoint_every=1000"],
                         about="one GPU, ≈a day"),
}


def run_demo(profile: str = "default", out: str | Path | None = None, data_path: str | None = None,
             jobs: int | None = None, progress: bool = True, log=None, precision: str = "auto") -> Path:
    """``plelab demo``: run the ``profile`` (default | quick | study | long | study-gpu) into ``out`` (default
    ``runs/demo-PROFILE-DATE-TIME``; rerun to resume), on ``data_path`` instead of the embedded corpus if given,
    with ``jobs`` worker processes (default one per core up to 8; 1 on a GPU), every run in ``precision``
    (``auto``: the study rule, :func:`plelab.precision.study_precision`; ``fp32`` | ``bf16`` force it). Returns the
    report's HTML file."""
    if profile not in PROFILES:
        raise ConfigError(f"unknown demo profile {profile!r}: choose one of {', '.join(PROFILES)}")
    if precision not in ("auto", "fp32", "bf16"):
        raise ConfigError(f"--precision {precision!r}: choose auto, fp32 or bf16")
    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    log = log or say
    started = time.perf_counter()
    prof = PROFILES[profile]
    out = Path(out) if out is not None else Path("runs") / time.strftime(f"demo-{profile}-%Y%m%d-%H%M%S")
    rows = []
    for dp in (0, 64, 128, 256, 512):
        c = resolve_config("seed-3b", dp=dp)
        rows.append(account(c.model, c.ple, c.train.seq_len))
    log(accounting_tables("seed-3b", rows, "H=2560, L=32, V=100,096, 20Q/4KV heads, FFN 6912, tied"))

    forced = [] if precision == "auto" else [f"train.precision={precision}"]
    data_sets = ([f"data.path={data_path}"] if data_path else
                 [f"data.embedded={prof.corpus}"] if prof.corpus != "stdlib" else [])
    overrides = list(prof.overrides) + data_sets + forced
    base = resolve_config(prof.preset, overrides, steps=prof.steps)
    data = prepare_token_data(base, progress=progress)
    entropy = data.unigram_entropy(base.model.vocab_size)
    log(f"\ncorpus {data.corpus_name}: {data.n_train_docs + data.n_val_docs:,} distinct "
        f"{'pieces of too few documents' if data.n_pieces else 'documents'}, "
        f"sha256 {data.corpus_fingerprint[:16]}…; tokens: train {len(data.train):,}, validation {len(data.val):,}; "
        f"validation unigram entropy {entropy:.3f} nats")
    tokens = prof.steps * base.train.batch_size * base.train.seq_len
    trunk = account(base.model, base.ple, base.train.seq_len)
    embeddings = trunk.groups["embed_tokens"] + trunk.groups["lm_head"]
    log(f"sweep ({profile}, {prof.about}): {prof.preset}, dP {prof.dims} × {prof.seeds} seeds"
        + (f" + controls {', '.join(prof.controls)}" if prof.controls else "")
        + f", {prof.steps} steps = {tokens:,} tokens ({tokens / len(data.train):.2f} epochs) per run: "
          f"{tokens / (trunk.base - embeddings):.1f} tokens per trunk parameter without embeddings, "
          f"{tokens / trunk.base:.1f} with\n")
    spec = merge_spec(out, dp_spec(preset=prof.preset, overrides=overrides, dp=prof.dims, seeds=prof.seeds,
                                   controls=prof.controls, steps=prof.steps, existing=load_spec(out)))
    if jobs is None:
        jobs = 1 if base.train.device.startswith("cuda") else max(1, min(available_cores(), 8))
    rungs = [] if prof.ladder is None else ladder_specs(prof.ladder, out, prof.preset, overrides,
                                                          (base.model.hidden_size, prof.steps))
    if rungs:
        lad = prof.ladder
        log(f"scaling-fit ladder: H {', '.join(map(str, lad.hidden))} × {', '.join(map(str, lad.steps))} steps, "
            f"dP 0 and dP/H = {lad.ratio:g}, {lad.seeds} seeds ({len(rungs)} sweeps in {out / 'ladder'}, after the "
            "study)")
        log(study_estimate([(out, spec), *rungs], jobs, log) + "\n")
    run_sweep(out, spec, jobs=jobs, progress=progress, log=log)
    paths = write_report(out)
    report = next(p for p in paths if p.suffix == ".html")
    findings = (out / "report" / "report.md").read_text().split("## Findings", 1)[1].split("\n## ", 1)[0]
    log("\nFindings" + findings.rstrip())
    log(f"\nReport: {report} (Markdown beside it: {report.with_suffix('.md')}); "
        f"plelab advise {out} recommends a dP from it.")
    if rungs:
        for folder, rung in rungs:
            run_sweep(folder, rung, jobs=jobs, progress=progress, log=log)
        fit = fit_runs([out])
        write_json(out / "report" / "fit.json", fit)
        log(f"\nScaling fit over every finished run in {out} (plelab fit {out}; JSON: {out / 'report' / 'fit.json'})\n"
            + fit_text(fit))
    if prof.visual:
        run_visual_part(out / "visual", "quick" if profile == "quick" else "demo", jobs, progress, log, forced)
    log(f"Demo wall time {time.perf_counter() - started:.0f} s.")
    return report


def run_visual_part(out: Path, profile: str, jobs: int, progress: bool, log, overrides: list[str] = ()) -> Path:
    """Visual PLE in brief: no visual table vs a DCT + K-means table vs the same with L_visual (λ = 0.5),
    and the IDs as targets only, with the oracle and random IDs that gate the findings — paired, 3 seeds; the
    findings of its report."""
    methods = ["none", "oracle"] if profile == "quick" else ["none", "dct-kmeans"]
    log(f"\nvisual PLE ({VISUAL_PROFILES[profile].about}): methods {', '.join(methods)}; the fix's 2×2 at λ = 0.5; "
        "the gate: oracle vs random IDs")
    spec = merge_spec(out, visual_spec(profile, methods, design="fix", lambdas=[0.5], gate=True,
                                       overrides=list(overrides)))
    run_sweep(out, spec, jobs=jobs, progress=progress, log=log)
    paths = write_visual_report(out)
    report = next(p for p in paths if p.suffix == ".html")
    md = (out / "report" / "report.md").read_text()
    findings = md.split("## Findings", 1)[1].split("\n## ", 1)[0]
    fix = md.split("## The visual next-token fix", 1)
    log("\nVisual findings" + findings.rstrip())
    if len(fix) == 2:
        log("\nThe visual next-token fix" + fix[1].split("\n## ", 1)[0].rstrip())
    log(f"\nVisual report: {report}")
    return report
