"""The labelled benchmark behind the verdict: which runs ``plelab calibrate`` trains, and what is true of each.

A *regime* is one model scale on one corpus; its runs are one sweep (``DIR/{scale}-{corpus}``, run by
:mod:`plelab.sweeps.runner`: resumable, ``--jobs`` workers, every arm of a seed with the same data order and
trunk init). A *configuration* is one arm of one regime: a *class* at one dP. The classes, with what their
construction says about LEARNED (the table holds structure beyond its null):

==========  =====================================================  ==========================
class       overrides (at dP = d)                                  LEARNED by construction
==========  =====================================================  ==========================
``real``    the real token ids                                     yes
``scalar``  real ids, the seed's learned scalar gate (init 1)      yes
``slow``    real ids, table learning rate ×0.01                    yes (weak)
``small``   real ids at the benchmark's smallest dP                yes (weak)
``iid``     ids drawn i.i.d. from the token frequencies            no (the hard negative)
``frozen``  table kept at its random init                          no (easy)
``gate0``   the seed's scalar gate held at 0 (no gradient)         no (easy)
``zero``    table zeroed and frozen                                not called: BENEFIT's reference
``none``    no PLE at all (dP 0; one arm per regime)               not called: BENEFIT's reference
``near0``   real ids, the seed's scalar gate started at 0.01       yes (weak; the validation's only)
==========  =====================================================  ==========================

Other mechanisms of the table family (``kinds``: value embeddings, the hashed n-gram table, token modulation) add
two arms each at dP 0, ``KIND-real`` (class ``real``) and ``KIND-iid`` (``aux.ids=iid``, class ``iid``), with the
no-PLE baseline as their BENEFIT reference. Their calls are never fitted: the thresholds are PLE's, and the report
measures them held out by mechanism (fitted on PLE only, scored on each other kind).

USED and BENEFIT are known by construction for some classes and read from the finished runs for the others
(:mod:`.truth`: what each call claims and what scores it). Every
run checkpoints at ``DECISIONS`` evenly spaced points; each checkpoint is a decision point of the time curve.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from plelab.config.schema import TrainConfig
from plelab.errors import ConfigError
from plelab.io import check_name
from plelab.runs import warm_caches
from plelab.sweeps.configs import base_config
from plelab.sweeps.runner import data_key, run_sweep
from plelab.sweeps.spec import Arm, SweepSpec, load_spec

PRESET = "cpu-tiny"
DECISIONS = 8  # checkpoints per run: decision points at 1/8, 2/8, ..., 8/8 of the run
CLASSES = ("real", "scalar", "slow", "small", "iid", "frozen", "gate0", "zero", "none")
LEARNED_BY_CLASS = {"real": True, "scalar": True, "slow": True, "small": True, "iid": False, "frozen": False,
                    "gate0": False, "near0": True}
SLOW_LR = 0.01
CLASS_OVERRIDES = {
    "real": [], "small": [], "scalar": ["ple.gate=scalar", "ple.gate_init=1"],
    "slow": [f"train.table_lr_mult={SLOW_LR:g}"], "iid": ["ple.ids=iid"],
    "frozen": ["ple.table=frozen"], "gate0": ["ple.gate=scalar", "ple.gate_init=0", "ple.gate_learn=false"],
    "zero": ["ple.table=zero"], "none": [],
    "near0": ["ple.gate=scalar", "ple.gate_init=0.01"]}  # the seed's gate started near closed: validation only
# Model scales (on the cpu-tiny preset): hidden size, layers, FFN width, heads / kv heads.
SCALES = {
    "h32": ["model.hidden_size=32", "model.num_hidden_layers=2", "model.intermediate_size=96",
            "model.num_attention_heads=2", "model.num_key_value_heads=1"],
    "h64": ["model.hidden_size=64", "model.num_hidden_layers=2", "model.intermediate_size=176"],
    "h96": ["model.hidden_size=96", "model.num_hidden_layers=3", "model.intermediate_size=256",
            "model.num_attention_heads=4", "model.num_key_value_heads=2"],
}
# The deterministic recipe every benchmark run shares (fp32: the same losses on every CPU).
# every use test's validation windows: the trainer's default, recorded in calibration.json for the verdict
USE_WINDOWS = TrainConfig().diag_windows
COMMON = ["train.precision=fp32", "train.threads=1", f"train.diag_windows={USE_WINDOWS}", "train.eval_batches=8",
          "train.early_checkpoint=0", "train.table_weight_decay=0"]


@dataclass
class Benchmark:
    """What to train: ``scales`` × ``corpora`` regimes, each with the no-PLE baseline and the classes at ``dims``
    (``small`` at the smallest, every other class at each larger dP; ``iid`` and ``zero`` at every dP),
    ``seeds`` seeds of ``steps`` steps. ``corpora``: name -> data overrides (``[]``: the embedded corpus)."""

    scales: list[str] = field(default_factory=lambda: list(SCALES))
    corpora: dict[str, list[str]] = field(default_factory=lambda: {"embedded": []})
    dims: list[int] = field(default_factory=lambda: [4, 8, 16])
    seeds: int = 4
    steps: int = 320
    batch_size: int = 8
    seq_len: int = 64
    kinds: list[str] = field(default_factory=list)  # other mechanisms of the table family (MECHANISMS)

    def validate(self) -> None:
        unknown = [s for s in self.scales if s not in SCALES]
        if unknown:
            raise ConfigError(f"unknown calibration scale {unknown[0]!r}: choose from {', '.join(SCALES)}")
        if len(self.dims) < 1 or sorted(set(self.dims)) != sorted(self.dims) or min(self.dims) < 1:
            raise ConfigError(f"calibration dims {self.dims}: distinct integers >= 1")
        if self.seeds < 3:
            raise ConfigError(f"calibration needs >= 3 seeds (a call's truth is read off the other seeds), got "
                              f"{self.seeds}")
        if self.steps < DECISIONS or self.steps % DECISIONS:
            raise ConfigError(f"calibration steps must be a multiple of {DECISIONS} (one checkpoint per decision "
                              f"point), got {self.steps}")
        for name in self.corpora:
            check_name(name, "corpus name")
        unknown = [k for k in self.kinds if k not in MECHANISMS]
        if unknown or len(set(self.kinds)) != len(self.kinds):
            raise ConfigError(f"calibration kinds {self.kinds}: distinct names from {', '.join(MECHANISMS)}")

    def regimes(self) -> list[tuple[str, str, str]]:
        """``(folder name, scale, corpus)`` of every regime."""
        return [(f"{s}-{c}", s, c) for c in self.corpora for s in self.scales]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


MECHANISMS = ("value", "ngram", "modulation")  # the table family besides PLE (aux.kind)
QUICK = Benchmark(scales=["h32"], dims=[4, 16], seeds=3, steps=128, kinds=list(MECHANISMS))


def mechanism_of(arm: Arm) -> str:
    """The table kind an arm trains (``ple`` unless it sets ``aux.kind``)."""
    return next((o.partition("=")[2] for o in arm.overrides if o.startswith("aux.kind=")), "ple")


def arms(dims: list[int], kinds: list[str] = ()) -> list[Arm]:
    """The configurations of one regime (family = class, x = dP; the other kinds' arms at dP 0)."""
    dims = sorted(dims)
    out = [Arm("none-dp0", ["ple.dim=0"], "none", 0, description="no PLE (dP 0)")]
    for d in dims:
        classes = ["small", "iid", "zero"] if d == dims[0] and len(dims) > 1 else \
            ["real", "scalar", "slow", "iid", "frozen", "gate0", "zero"]
        for c in classes:
            out.append(Arm(f"{c}-dp{d}", [f"ple.dim={d}", *CLASS_OVERRIDES[c]], c, d,
                           reference=f"zero-dp{d}" if c != "zero" else None, description=f"{c} at dP={d}"))
    for kind in kinds:
        for c in ("real", "iid"):
            out.append(Arm(f"{kind}-{c}", ["ple.dim=0", f"aux.kind={kind}", *(["aux.ids=iid"] if c == "iid" else [])],
                           c, 0, reference="none-dp0", description=f"a {kind} table keyed by {c} ids"))
    return out


def decision_steps(steps: int) -> list[int]:
    """The ``DECISIONS`` decision points of a ``steps``-step run (its checkpoints, one every eighth)."""
    every = steps // DECISIONS
    return [every * k for k in range(1, DECISIONS + 1)]


def regime_overrides(steps: int, batch_size: int, seq_len: int) -> list[str]:
    """The recipe every calibration run shares (:data:`COMMON`) with a checkpoint and use test at each of the
    ``DECISIONS`` decision points of a ``steps``-step run."""
    every = steps // DECISIONS
    return [*COMMON, f"train.batch_size={batch_size}", f"train.seq_len={seq_len}", f"train.checkpoint_every={every}",
            f"train.keep_checkpoints={DECISIONS}", f"train.eval_every={max(1, every // 2)}",
            f"train.diag_every={every}", f"train.warmup_steps={max(1, steps // 16)}"]


def regime_spec(bench: Benchmark, scale: str, corpus: str) -> SweepSpec:
    overrides = [*SCALES[scale], *bench.corpora[corpus], *regime_overrides(bench.steps, bench.batch_size,
                                                                             bench.seq_len)]
    return SweepSpec(preset=PRESET, overrides=overrides, arms=arms(bench.dims, bench.kinds),
                     seeds=list(range(bench.seeds)), steps=bench.steps, kind="calibrate",
                     baseline=f"zero-dp{max(bench.dims)}")


def extends(old: SweepSpec, new: SweepSpec) -> bool:
    """May ``new`` continue the regime folder ``old`` was started with? The same shared settings and steps, and
    every arm both define defined alike; ``new`` may add arms (another dP), so finished runs are kept."""
    mine = {a.name: a.overrides for a in new.arms}
    return (old.overrides == new.overrides and old.steps == new.steps
            and all(mine.get(a.name, a.overrides) == a.overrides for a in old.arms))


def run_benchmark(root: str | Path, bench: Benchmark, jobs: int = 1, progress: bool = True, log=print) -> list[Path]:
    """Train (or resume) every regime's runs under ``root``; return the regime folders. A folder that holds
    another definition is refused before anything runs."""
    bench.validate()
    root = Path(root)
    folders = []
    for name, scale, corpus in bench.regimes():
        spec, folder = regime_spec(bench, scale, corpus), root / name
        old = load_spec(folder)
        if old is not None and not extends(old, spec):
            raise ConfigError(f"{folder} holds a calibration regime with other settings; choose another --out or "
                              "rerun with the settings it was started with (more --dims or --seeds may be added)")
        if old is not None and len(old.seeds) > len(spec.seeds):
            spec.seeds = old.seeds
        folders.append((folder, spec))
    # every regime's data before any run trains, the user's corpora first: one that cannot be read (empty, binary, of
    # a format plelab does not read) is refused at once, not after the regimes before it have trained
    warmed = set()
    for _, spec in sorted(folders, key=lambda fs: fs[0].name.endswith("-embedded")):
        cfg = base_config(spec)
        if data_key(cfg) not in warmed:
            warm_caches(cfg)
            warmed.add(data_key(cfg))
    for folder, spec in folders:
        run_sweep(folder, spec, jobs=jobs, progress=progress, log=log)
    return [f for f, _ in folders]
