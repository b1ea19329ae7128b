"""What a sweep is: arms × seeds on one preset, saved as ``SWEEP/sweep.json``.

An :class:`Arm` is a list of config overrides on top of the sweep's base (preset + base
overrides). Every run of a sweep is ``SWEEP/runs/{arm}/seed-{k}``; for a given seed every arm
gets the same data order and the same initial trunk weights (``plelab.model.init`` seeds each
parameter by name), so the arms are compared in pairs.

The dP study's arms (:func:`dp_arms`): the main curve ``dp{N}`` (``dp0`` is the baseline),
optional variants crossed with every dP > 0, and the controls of the seed's open questions:

- ``frozen``: the table kept at its random init — a fixed random code per token: does *training* the table matter?
- ``zero``: the table zeroed and frozen — what remains is the main embedding re-injected into every layer through
  the model-level projection (a value-embedding-like path): is the gain the table's or that path's?
- ``iid``: the table learned but looked up by ids drawn i.i.d. from the token frequencies (``ple.ids=iid``) —
  the no-information control: same parameters, same row update statistics, nothing about the token;
- ``matched``: the table multiplier fixed at sqrt(d_ref) instead of sqrt(dP), so the table's
  share of the per-layer input and its effective step size do not grow with dP;
- ``table-lr``: the table's learning rate ×⅓ and ×3 at ``control_dp``;
- ``boost``: the table multiplier ×4 at ``control_dp`` (does the loss move when the signal is
  made stronger — put ``control_dp`` inside an apparent dead zone);
- ``gate-scalar`` / ``gate-vector``: the seed's learned gate (a scalar or a vector g_l, init ``GATE_INIT``,
  recorded in the arm's overrides) instead of Gemma's GELU gate, at every dP: under it the seed's "gate stays
  closed" mechanism can occur, which Gemma's post-norm (fixed branch RMS at any dP) rules out;
- ``gate-scalar-small`` / ``gate-scalar-0``: the seed's scalar gate started near closed (init 0.01) or shut (init
  0), at every dP — the seed's loop as it states it: does the gate open, when, and does that depend on dP
  (:mod:`plelab.stats.mechanism`)?
- ``trunk-params`` / ``trunk-flops``: no PLE, the FFN widened to spend what PLE at ``control_dp`` adds in
  parameters / in training FLOPs per token (``model.accounting.matched_trunk``): would the trunk have used them
  better?

Arms of the table family's other kinds (:func:`aux_arm`, ``--aux KIND[:KEY=VALUE...]``): ``ple.dim=0`` with
``aux.kind`` set and its sizes (``aux.*``), family the kind, compared with the baseline as the controls are.

A sweep may grow (new arms or seeds are added on the next call); an existing arm's
definition, the preset, the base overrides and the step budget may not change, nor may its analysis plan — δ, α,
the outcome (``last_k``) and the baseline, fixed and hashed when the sweep is first saved
(:mod:`plelab.sweeps.analysis_plan`).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from plelab.config.aux_schema import AUX_KEYS
from plelab.errors import PlelabError
from plelab.io import check_name, write_json
from plelab.sweeps import analysis_plan

CONTROLS = ("frozen", "zero", "iid", "matched", "table-lr", "boost", "gate-scalar", "gate-vector", "gate-scalar-small",
            "gate-scalar-0", "trunk-params", "trunk-flops")
CURVE_CONTROLS = ("frozen", "zero", "iid", "matched", "gate-scalar", "gate-vector", "gate-scalar-small",
                  "gate-scalar-0")  # crossed with every dP: curves
# The seed's loop starts from a shut gate: the scalar gate started near closed, and at exactly 0.
SHUT_GATES = {"gate-scalar-small": 0.01, "gate-scalar-0": 0.0}
SPEC_FILE = "sweep.json"
BUDGET = "budget"  # the family of the baseline's longer runs (the budget ladder of the wall-clock reading)
BOOST = 4.0
TABLE_LR_FACTORS = (1 / 3, 3.0)
GATE_INIT = 1.0  # the learned gates' initial value in the gate controls (ple.gate_init)
DEFAULT_DELTA, DEFAULT_LAST_K = 0.02, 3
# A dP study's default margin, from its question: below the seed's dP 0 → 64 gain (0.006 nats) and its 128 → 256
# "phase transition" (0.017), so that an equivalence at ±δ could call neither "no change" (the seed's table).
DP_DELTA = 0.005


@dataclass
class Arm:
    """One arm: ``overrides`` on top of the sweep's base config.

    ``family`` groups arms into curves ("dP" is the main curve; controls and variants have their
    own); ``x`` is the arm's position on its curve (dP); ``reference`` is the arm a control is
    compared with seed by seed; ``alias_of`` marks an arm whose config equals another's (not
    rerun, its results are the other arm's).
    """

    name: str
    overrides: list[str]
    family: str = "dP"
    x: float = 0.0
    reference: str | None = None
    alias_of: str | None = None
    description: str = ""


@dataclass
class SweepSpec:
    preset: str
    overrides: list[str] = field(default_factory=list)
    arms: list[Arm] = field(default_factory=list)
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    steps: int | None = None
    kind: str = "dp"
    # Mean of the last k evaluations is the run's loss; δ is the smallest effect of interest (nats).
    last_k: int = DEFAULT_LAST_K
    delta: float = DEFAULT_DELTA
    alpha: float = 0.05
    baseline: str = "dp0"
    # Where the point controls sit and the matched arms' fixed multiplier dimension (kept when the sweep grows).
    control_dp: int | None = None
    matched_ref: int | None = None
    # The lr-search folder whose lr.json set the arms' rates (--lr-from), for the sweep's command line; the rates
    # themselves are in the arms' overrides.
    lr_from: str | None = None
    # The analysis plan (δ, α, last_k, baseline, the rules) declared when the sweep was first saved, with its hash;
    # None until then, and in sweeps saved before plelab fixed plans.
    plan: dict | None = None

    def arm(self, name: str) -> Arm:
        for a in self.arms:
            if a.name == name:
                return a
        raise KeyError(name)

    def at(self, family: str, x: float) -> str | None:
        """The name of the arm of ``family`` at position ``x`` (e.g. ``at("dP", 32)``, ``at("zero", 32)``), or None.
        Arms are found by family and position, never by parsing their names."""
        return next((a.name for a in self.arms if a.family == family and a.x == x), None)

    def runnable(self) -> list[Arm]:
        return [a for a in self.arms if a.alias_of is None]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> SweepSpec:
        d = dict(d)
        d["arms"] = [Arm(**a) for a in d.get("arms", [])]
        return cls(**{k: v for k, v in d.items() if k in {f.name for f in dataclasses.fields(cls)}})


def run_dir(root: Path, arm: str, seed: int) -> Path:
    return Path(root) / "runs" / check_name(arm, "arm name") / f"seed-{int(seed)}"


def aux_arm(kind: str, settings: dict[str, str] | None = None) -> Arm:
    """The arm of another kind of the table family: ``ple.dim=0``, ``aux.kind=KIND`` and its sizes ``settings``
    (``aux`` keys without the prefix: ``{"rows": "2003"}``), named ``KIND[-KEYVALUE...]`` (``ngram-rows2003``)."""
    if kind not in AUX_KEYS:
        raise PlelabError(f"unknown table kind {kind!r} for --aux: choose one of {', '.join(AUX_KEYS)} (PLE is --dp)")
    settings = dict(settings or {})
    bad = [k for k in settings if k not in (*AUX_KEYS[kind], "init", "ids")]
    if bad:
        allowed = ", ".join((*AUX_KEYS[kind], "init", "ids"))
        raise PlelabError(f"--aux {kind}: {bad[0]!r} is not one of its settings ({allowed})")
    name = "-".join([kind, *(f"{k}{v}".replace(",", ".").replace(" ", "") for k, v in settings.items())])
    described = ", ".join(f"{k}={v}" for k, v in settings.items())
    return Arm(check_name(name, "arm name"), ["ple.dim=0", f"aux.kind={kind}",
                                               *(f"aux.{k}={v}" for k, v in settings.items())], kind, 0.0,
               description=f"no PLE; a {kind} table" + (f" ({described})" if described else ""))


def budget_arm(multiple: float, steps: int, baseline: str = "dp0") -> Arm:
    """The baseline trained ``multiple`` × its ``steps`` (a run of its own, with its own schedule): a point of the
    budget ladder the wall-clock reading interpolates on (:mod:`plelab.stats.wallclock`), named ``dp0-x1.25``."""
    if not multiple > 1:
        raise PlelabError(f"--budgets takes multiples of the steps > 1 (the baseline itself is 1), got {multiple:g}")
    return Arm(check_name(f"{baseline}-x{multiple:g}", "arm name"),
               ["ple.dim=0", f"train.steps={round(multiple * steps)}"], BUDGET, float(multiple), description=f"baseline at {multiple:g}× the steps (budget ladder)")


def aux_settings(arm: Arm) -> str:
    """``--aux``'s text for an arm made by :func:`aux_arm` (``ngram:rows=2003``)."""
    return ":".join([arm.family, *(o.removeprefix("aux.") for o in arm.overrides[2:])])


def dp_arms(dims: list[int], controls: list[str] = (), control_dp: int | None = None,
            variants: dict[str, list[str]] | None = None, matched_ref: int | None = None,
            trunk_widths: dict[str, int] | None = None, aux: list[Arm] = ()) -> list[Arm]:
    """The dP study's arms (see the module docstring). ``dims`` must include 0 (the baseline);
    ``control_dp`` defaults to the middle positive dP, ``matched_ref`` to the smallest. ``trunk_widths``: the
    FFN widths of the ``trunk-params`` / ``trunk-flops`` controls at ``control_dp`` (from
    :func:`plelab.model.accounting.matched_trunk`; :func:`plelab.sweeps.commands.dp_spec` computes them)."""
    dims = sorted(set(dims))
    if 0 not in dims:
        raise PlelabError("--dp must include 0: the baseline every arm is paired with")
    positive = [d for d in dims if d > 0]
    if not positive:
        raise PlelabError("--dp needs at least one value > 0 besides the baseline 0, e.g. --dp 0,16,32")
    unknown = [c for c in controls if c not in CONTROLS]
    if unknown:
        raise PlelabError(f"unknown control {unknown[0]!r}: choose from {', '.join(CONTROLS)} (or 'all')")
    reserved = [n for n in (variants or {}) if n in (*CONTROLS, *AUX_KEYS, "dP") or n.startswith("tablelr")]
    if reserved:
        raise PlelabError(f"--variant name {reserved[0]!r} is taken by a built-in arm family; choose another name")
    control_dp = positive[len(positive) // 2] if control_dp is None else control_dp
    trunk = [c for c in controls if c.startswith("trunk-")]
    if trunk and not all(c.removeprefix("trunk-") in (trunk_widths or {}) for c in trunk):
        raise PlelabError(f"the {trunk[0]} control needs the matched FFN width (use plelab sweep or dp_spec)")
    if control_dp not in positive and ({"table-lr", "boost", *trunk} & set(controls)):
        raise PlelabError(f"--control-dp {control_dp} is not one of the swept dP values {positive}")
    arms = [Arm(f"dp{d}", [f"ple.dim={d}"], "dP", d, description="baseline (no PLE)" if d == 0 else f"dP={d}")
            for d in dims]
    for name, extra in (variants or {}).items():
        arms += [Arm(f"dp{d}-{name}", [f"ple.dim={d}", *extra], name, d, reference=f"dp{d}",
                     description=f"dP={d} with {' '.join(extra)}") for d in positive]
    if "frozen" in controls:
        arms += [Arm(f"dp{d}-frozen", [f"ple.dim={d}", "ple.table=frozen"], "frozen", d, reference=f"dp{d}",
                     description="table frozen at its random init (does training the table matter?)")
                 for d in positive]
    if "zero" in controls:
        arms += [Arm(f"dp{d}-zero", [f"ple.dim={d}", "ple.table=zero"], "zero", d, reference=f"dp{d}",
                     description="table zeroed: the main embedding re-injected into every layer (value-embedding-"
                                 "like path)") for d in positive]
    if "iid" in controls:
        arms += [Arm(f"dp{d}-iid", [f"ple.dim={d}", "ple.ids=iid"], "iid", d, reference=f"dp{d}",
                     description="table looked up by i.i.d. ids: no information about the token") for d in positive]
    if "matched" in controls:
        ref = positive[0] if matched_ref is None else matched_ref
        arms += [Arm(f"dp{d}-matched", [f"ple.dim={d}", f"ple.table_scale_dim={ref}"], "matched", d,
                     reference=f"dp{d}", alias_of=f"dp{d}" if d == ref else None,
                     description=f"table multiplier fixed at sqrt({ref}) for every dP") for d in positive]
    if "table-lr" in controls:
        for f in TABLE_LR_FACTORS:
            tag = "third" if f < 1 else "x3"
            arms.append(Arm(f"dp{control_dp}-tablelr-{tag}", [f"ple.dim={control_dp}", f"train.table_lr_mult={f:.6g}"],
                            "table-lr", control_dp, reference=f"dp{control_dp}",
                            description=f"table learning rate ×{'⅓' if f < 1 else '3'}"))
    if "boost" in controls:
        arms.append(Arm(f"dp{control_dp}-boost", [f"ple.dim={control_dp}", f"ple.table_scale={BOOST:g}"], "boost",
                        control_dp, reference=f"dp{control_dp}",
                        description=f"table multiplier ×{BOOST:g} (stronger injected signal)"))
    for gate in ("scalar", "vector"):
        if f"gate-{gate}" in controls:
            arms += [Arm(f"dp{d}-gate-{gate}", [f"ple.dim={d}", f"ple.gate={gate}", f"ple.gate_init={GATE_INIT:g}"],
                         f"gate-{gate}", d, reference=f"dp{d}",
                         description=f"the seed's learned {gate} gate (init {GATE_INIT:g}) instead of Gemma's")
                     for d in positive]
    for name, init in SHUT_GATES.items():
        if name in controls:
            arms += [Arm(f"dp{d}-{name}", [f"ple.dim={d}", "ple.gate=scalar", f"ple.gate_init={init:g}"], name, d,
                         reference=f"dp{d}", description=f"the seed's learned scalar gate started at {init:g} (near "
                                                         "closed): does it open?") for d in positive]
    for c in trunk:
        match, width = c.removeprefix("trunk-"), trunk_widths[c.removeprefix("trunk-")]
        arms.append(Arm(f"dp{control_dp}-{c}", ["ple.dim=0", f"model.intermediate_size={width}"], c, control_dp,
                        reference=f"dp{control_dp}", description=f"no PLE, FFN {width} wide: the {match} of PLE at "
                                                                 f"dP={control_dp} spent on the trunk"))
    arms += list(aux)
    names = [check_name(a.name, "arm name") for a in arms]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise PlelabError(f"two arms are both named {dup!r}; rename the --variant (or give --aux once per size)")
    return arms


def sweep_command(spec: SweepSpec, root: Path, seeds: int | None = None) -> str:
    """The ``plelab sweep`` line that gives (or, with more ``seeds``, grows) this dP sweep."""
    main = sorted(int(a.x) for a in spec.arms if a.family == "dP")
    families = {a.family for a in spec.arms}
    parts = ["plelab", "sweep", "--preset", spec.preset, "--dp", ",".join(map(str, main))]
    controls = [c for c in CONTROLS if c in families]
    if controls:
        parts += ["--controls", ",".join(controls)]
        if spec.control_dp is not None and {"table-lr", "boost", "trunk-params", "trunk-flops"} & set(controls):
            parts += ["--control-dp", str(spec.control_dp)]
    for fam in sorted(families - set(CONTROLS) - set(AUX_KEYS) - {"dP", BUDGET}):
        extra = next(a.overrides[1:] for a in spec.arms if a.family == fam)
        parts += ["--variant", f"{fam}:{','.join(extra)}"]
    for arm in (a for a in spec.arms if a.family in AUX_KEYS):
        parts += ["--aux", aux_settings(arm)]
    budgets = [a.x for a in spec.arms if a.family == BUDGET]
    if budgets:
        parts += ["--budgets", ",".join(f"{m:g}" for m in budgets)]
    if spec.steps is not None:
        parts += ["--steps", str(spec.steps)]
    for o in spec.overrides:
        parts += ["--set", o]
    if spec.lr_from is not None:
        parts += ["--lr-from", spec.lr_from]
    n = seeds if seeds is not None else len(spec.seeds)
    parts += ["--seeds", str(n)] if spec.seeds == list(range(len(spec.seeds))) or seeds else \
        ["--seed-list", ",".join(map(str, spec.seeds))]
    if spec.delta != DP_DELTA:
        parts += ["--delta", f"{spec.delta:g}"]
    if spec.last_k != DEFAULT_LAST_K:
        parts += ["--last-k", str(spec.last_k)]
    return " ".join(shlex.quote(p) for p in [*parts, "--out", str(root)])


RESTORE = "restore it, or start the study in another folder (plelab sweep --out)"  # report, advise, plan: no --out


def load_spec(root: Path) -> SweepSpec | None:
    path = Path(root) / SPEC_FILE
    if not path.exists():
        return None
    try:
        spec = SweepSpec.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, AttributeError) as err:
        raise PlelabError(f"{path} is not a readable plelab sweep ({err}); {RESTORE}") from None
    try:  # names become folders under runs/: none may lead outside the sweep
        for arm in spec.arms:
            check_name(arm.name, "arm name")
        if not isinstance(spec.seeds, list) or not all(type(s) is int for s in spec.seeds):
            raise PlelabError(f"invalid seeds {spec.seeds!r}: a list of integers")
        check_size(spec)
    except PlelabError as err:
        raise PlelabError(f"{path} is not a valid plelab sweep ({err}); {RESTORE}") from None
    analysis_plan.verify(spec, path)
    return spec


def merge_spec(root: Path, new: SweepSpec) -> SweepSpec:
    """The spec to run in ``root``: ``new`` if the folder is empty, else the saved one grown by
    ``new``'s extra arms and seeds (a changed definition or analysis plan is refused, nothing is written)."""
    old = load_spec(root)
    if old is None:
        if (Path(root) / "runs").exists():
            raise PlelabError(f"{root} has runs/ but no {SPEC_FILE}; it is not a plelab sweep — choose another --out")
        return new
    for key in ("preset", "overrides", "steps", "kind", "baseline"):
        if getattr(old, key) != getattr(new, key):
            raise PlelabError(f"{root} holds a sweep with {key}={getattr(old, key)!r}, not {getattr(new, key)!r}; "
                              "rerun with the same settings to continue it, or choose another --out")
    key = analysis_plan.changed(old, new)
    if key is not None:
        raise analysis_plan.refusal(root, old, key, getattr(new, key))
    analysis_plan.refuse_growth(root, old, new)
    arms = list(old.arms)
    for a in new.arms:
        try:
            mine = old.arm(a.name)
        except KeyError:
            arms.append(a)
            continue
        if mine.overrides != a.overrides:
            raise PlelabError(f"arm {a.name} in {root} was run with {mine.overrides}, now {a.overrides}; "
                              "choose another --out for a different definition")
    seeds = old.seeds + [s for s in new.seeds if s not in old.seeds]
    return dataclasses.replace(old, arms=arms, seeds=seeds,
                               control_dp=old.control_dp if old.control_dp is not None else new.control_dp,
                               matched_ref=old.matched_ref if old.matched_ref is not None else new.matched_ref)


# runs one sweep folder holds at most: reading a folder's state stats every run (a sweep.json listing 10^6 seeds took
# hours to report); a study larger than this is several sweeps
MAX_RUNS = 100_000


def check_size(spec: SweepSpec) -> None:
    """Refuse a sweep of more than :data:`MAX_RUNS` runs, or one that lists a seed twice."""
    runs = len(spec.arms) * len(spec.seeds)
    if runs > MAX_RUNS:
        raise PlelabError(f"a sweep of {runs:,} runs ({len(spec.arms)} arms × {len(spec.seeds):,} seeds): one sweep "
                          f"folder holds at most {MAX_RUNS:,}; split the study into several sweeps")
    if len(set(spec.seeds)) != len(spec.seeds):
        raise PlelabError(f"seeds {spec.seeds[:8]}... list a seed twice; give each seed once")


def save_spec(root: Path, spec: SweepSpec) -> SweepSpec:
    """Write ``spec`` to ``root/sweep.json``, declaring its analysis plan now if it has none; the spec saved."""
    check_size(spec)
    if spec.plan is None:
        spec = dataclasses.replace(spec, plan=analysis_plan.declare(spec))
    Path(root).mkdir(parents=True, exist_ok=True)
    write_json(Path(root) / SPEC_FILE, spec.to_dict())
    return spec
