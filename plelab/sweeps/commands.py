"""The dP sweep as library functions: :func:`dp_spec` (what ``plelab sweep`` describes) and :func:`sweep` (run it).

Both take typed Python arguments (lists, not comma-separated text); :mod:`plelab.cli.sweep` converts
the command line. The report is :func:`plelab.reports.sweep.write_report`; advice is
:func:`plelab.stats.advise.advise`.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from plelab.config import RunConfig, apply_overrides, config_file_overrides, resolve_config
from plelab.config.resolve import ConfigSource
from plelab.errors import ConfigError, PlelabError
from plelab.model.accounting import account, matched_trunk
from plelab.model.ngram import ngram_rows, resolve_sizes
from plelab.sweeps.lr_search import (DEFAULT_MULTS, DEFAULT_SEEDS, chosen_lrs, choose, lr_spec, read_choice, with_lrs,
                                     write_choice)
from plelab.sweeps.preregister import preregister
from plelab.sweeps.records import copy_records, record_path, sweep_roots
from plelab.sweeps.results import collect
from plelab.sweeps.cluster import emit_scripts
from plelab.sweeps.runner import RunJob, folder_done, jobs_of, record_finished, run_sweep, say
from plelab.sweeps.spec import (CONTROLS, DEFAULT_LAST_K, DP_DELTA, Arm, SweepSpec, aux_arm, budget_arm, check_size,
                                dp_arms, load_spec, merge_spec)

DEFAULT_PRESET = "cpu-sweep"
# dp_spec's arguments; plelab sweep's parsed options carry the same names
SPEC_OPTIONS = ("preset", "config", "overrides", "gate", "dp", "seeds", "seed_list", "controls", "control_dp",
                "variants", "aux", "budgets", "steps", "data", "delta", "last_k", "lr_from")


def dp_spec(*, preset: str | None = None, config: ConfigSource = None, overrides: Sequence[str] = (),
            gate: str | None = None, dp: Sequence[int] | None = None, seeds: int = 3,
            seed_list: Sequence[int] | None = None, controls: Sequence[str] | str = (), control_dp: int | None = None,
            variants: Mapping[str, Sequence[str]] | Sequence[tuple[str, Sequence[str]]] | None = None,
            aux: Sequence[str] = (), budgets: Sequence[float] = (), steps: int | None = None, data: str | None = None,
            delta: float | None = None,
            last_k: int | None = None, lr_from: str | Path | None = None, lrs: Mapping[str, float] | None = None,
            existing: SweepSpec | None = None) -> SweepSpec:
    """The :class:`SweepSpec` of a dP study (validated, nothing written).

    ``preset`` (default cpu-sweep) or ``config`` (a JSON / TOML file, or a dict, as the base every arm starts
    from; see :func:`plelab.config.resolve_run_config`), ``overrides`` (``section.key=value``) and ``data`` on
    top; ``dp``: the main curve including the baseline 0 (default 0 and the preset's dP); ``seeds`` 0..N-1 or
    ``seed_list``; ``controls`` (names, or ``"all"``) at ``control_dp``; ``variants``: name -> overrides (a
    dict or pairs), an arm family crossed with every dP > 0; ``aux``: arms of the table family's other kinds, each
    ``KIND[:KEY=VALUE...]`` (``"value"``, ``"ngram:rows=2003:heads=2"``; :func:`~plelab.sweeps.spec.aux_arm`;
    ``ngram:match=D`` sizes the n-gram table to PLE at dP D's added parameters: :func:`matched_aux`); ``budgets``:
    multiples m > 1 of the steps at which the baseline also trains (its budget ladder, ``dp0-x1.25``, …: the
    wall-clock reading of :mod:`plelab.stats.wallclock`). ``delta`` (the
    margin δ, nats) and ``last_k`` (a run's loss = the mean of its last k evaluations) go into the analysis plan;
    left out, they are ``existing``'s, or plelab's defaults for a new sweep (δ: :data:`~plelab.sweeps.spec.DP_DELTA`,
    from the question). ``lrs`` (group -> learning rate: ``baseline``, ``dP`` and each control family) or
    ``lr_from`` (a finished ``plelab lr-search`` folder) set each arm's ``train.lr`` (:mod:`plelab.sweeps.lr_search`).
    ``existing``: the spec already in the folder — its control placement is kept when ``control_dp`` is not given."""
    if lrs is not None and lr_from is not None:
        raise ConfigError("give lrs or --lr-from, not both")
    if delta is None:
        delta = existing.delta if existing is not None else DP_DELTA
    if last_k is None:
        last_k = existing.last_k if existing is not None else DEFAULT_LAST_K
    if last_k < 1:
        raise ConfigError(f"--last-k must be >= 1, got {last_k}")
    preset, file_overrides = config_file_overrides(config, preset, DEFAULT_PRESET)
    overrides = [*file_overrides, *overrides]
    if data:
        overrides.append(f"data.path={data}")
    base = resolve_config(preset, overrides, gate=gate, steps=steps)
    run_steps = base.train.steps
    if not 0 < base.train.early_checkpoint <= run_steps // 2 and not any(
            o.startswith("train.early_checkpoint=") for o in overrides):
        overrides.append(f"train.early_checkpoint={run_steps // 4}")  # the early verdict at a quarter (0 = none)
        base.train.early_checkpoint = run_steps // 4
    dims = list(dp) if dp else [0, base.ple.dim]
    if any(d < 0 for d in dims):
        raise ConfigError(f"invalid --dp {','.join(map(str, dims))!r}: dP values (ple.dim) are integers >= 0")
    controls = list(CONTROLS) if controls == "all" else list(controls)
    seed_values = list(seed_list) if seed_list else list(range(seeds))
    if len(seed_values) < 1 or seeds < 1:
        raise ConfigError("--seeds must be >= 1 (3 or more for any statistics)")
    if len(set(seed_values)) != len(seed_values):
        raise ConfigError(f"--seed-list {','.join(map(str, seed_values))!r} repeats a seed; each seed is one run per "
                          "arm")
    if gate:
        overrides.append(f"ple.gate={gate}")
    positive = sorted(d for d in set(dims) if d > 0)
    if control_dp is None:
        control_dp = existing.control_dp if existing is not None and existing.control_dp is not None else (
            positive[len(positive) // 2] if positive else None)
    matched_ref = existing.matched_ref if existing is not None and existing.matched_ref is not None else (
        positive[0] if positive else None)
    widths = None
    if control_dp is not None and any(c.startswith("trunk-") for c in controls):
        with_ple = dataclasses.replace(base.ple, dim=control_dp)
        widths = {m: matched_trunk(base.model, with_ple, base.train.seq_len, m).intermediate_size
                  for m in ("params", "flops")}
    arms = dp_arms(dims, controls, control_dp, {k: list(v) for k, v in dict(variants or {}).items()},
                   matched_ref=matched_ref, trunk_widths=widths,
                   aux=[parse_aux(matched_aux(text, base)) for text in aux])
    if len(set(budgets)) != len(budgets):
        raise ConfigError(f"--budgets {','.join(f'{m:g}' for m in budgets)} repeats a multiple; give each once")
    arms += [budget_arm(float(m), run_steps) for m in sorted(budgets)]
    if delta <= 0:
        raise ConfigError(f"--delta must be > 0 (the smallest effect of interest in nats), got {delta}")
    if lr_from is not None:
        lrs = read_choice(lr_from)
    elif lrs is None and existing is not None:
        lrs = chosen_lrs(existing)  # a sweep made with --lr-from keeps its rates when resumed without it
    if lrs is not None:
        arms = with_lrs(arms, "dp0", dict(lrs))
    recorded = (str(Path(lr_from).resolve()) if lr_from is not None
                else existing.lr_from if existing is not None and lrs is not None else None)
    spec = SweepSpec(preset=preset, overrides=overrides, arms=arms, seeds=seed_values, steps=steps, last_k=last_k,
                     delta=delta, control_dp=control_dp, matched_ref=matched_ref, lr_from=recorded)
    check_size(spec)  # before anything is resolved per run
    return spec


def parse_aux(text: str) -> Arm:
    """``--aux KIND[:KEY=VALUE...]`` as its arm (:func:`~plelab.sweeps.spec.aux_arm`); list values keep their
    commas (``value:layers=0,1``)."""
    kind, *parts = str(text).strip().split(":")
    settings = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ConfigError(f"invalid --aux {text!r}: write KIND[:KEY=VALUE...], e.g. ngram:rows=2003:heads=2")
        settings[key.strip()] = value.strip()
    return aux_arm(kind.strip(), settings)


def matched_aux(text: str, base: RunConfig) -> str:
    """``--aux ngram:match=D[:KEY=VALUE...]`` as ``ngram:rows=R[:...]``: the row count whose table adds as many
    parameters as PLE at dP ``D`` adds to the sweep's base trunk (the smallest admissible prime at or above it:
    :func:`~plelab.model.ngram.ngram_rows`), so the two are compared at matched parameters. Other texts unchanged."""
    kind, *parts = str(text).strip().split(":")
    match = [p for p in parts if p.partition("=")[0].strip() == "match"]
    if not match:
        return text
    if kind.strip() != "ngram":
        raise ConfigError(f"--aux {text!r}: match= sizes a table by its row count, which only the n-gram table has; "
                          "size a value or a modulation table by aux.layers (plelab params --aux counts them)")
    rest = [p for p in parts if p not in match]
    try:
        dp = int(match[0].partition("=")[2])
    except ValueError:
        dp = 0
    if dp < 1 or any(p.partition("=")[0].strip() == "rows" for p in rest):
        raise ConfigError(f"--aux {text!r}: match=D takes a dP >= 1 (PLE at dP D's added parameters) and replaces "
                          "rows=; give one of them")
    mc = base.model
    target = account(mc, dataclasses.replace(base.ple, dim=dp), base.train.seq_len).added
    probe = copy.deepcopy(base)
    apply_overrides(probe, ["ple.dim=0", "aux.kind=ngram", *(f"aux.{p.strip()}" for p in rest)])
    orders, _, dim = resolve_sizes(mc.vocab_size, mc.hidden_size, probe.aux.orders, probe.aux.heads, 2,
                                   probe.aux.dim)
    other = mc.hidden_size * len(orders) * probe.aux.heads * dim + mc.num_hidden_layers  # projection, λ_l
    rows = ngram_rows(mc.vocab_size, max(2, math.ceil((target - other) / dim)) / mc.vocab_size)
    return ":".join(["ngram", f"rows={rows}", *rest])


def options_of(args: object) -> dict:
    """:func:`dp_spec`'s arguments read off an object that carries them as attributes (``plelab sweep``'s parsed
    options, :func:`plelab.cli.build_parser`)."""
    return {name: getattr(args, name) for name in SPEC_OPTIONS}


def dp_spec_from_args(args: object, existing: SweepSpec | None = None) -> SweepSpec:
    """:func:`dp_spec` of ``plelab sweep``'s parsed options (see :func:`options_of`)."""
    return dp_spec(**options_of(args), existing=existing)


def sweep(out: str | Path, *, jobs: int = 1, emit: str | None = None, progress: bool = True, nodes: int = 1,
          log=None, **options) -> Path | list[RunJob]:
    """Run, resume or grow the dP sweep in ``out`` that ``options`` (:func:`dp_spec`'s arguments) describe, with
    ``jobs`` worker processes, and return its runs (:class:`~plelab.sweeps.runner.RunJob`: arm, seed, folder; read
    their results with :func:`plelab.report`); with ``emit`` (``"torchrun"`` / ``"slurm"``) write the per-run
    commands instead and return that file (``nodes`` per run). A folder that holds another sweep definition is
    refused (nothing written). ``log``: where the sweep's lines go (default: printed with ``progress``, silent
    without)."""
    if jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    if nodes != 1 and not emit:
        raise ConfigError(f"--nodes {nodes} needs --emit torchrun or --emit slurm: an in-process sweep runs on this "
                          "machine only")
    root = Path(out)
    spec = merge_spec(root, dp_spec(**options, existing=load_spec(root)))
    if emit:
        return emit_scripts(root, spec, emit, nodes)
    return run_sweep(root, spec, jobs=jobs, progress=progress,
                     log=log if log is not None else say if progress else (lambda *a: None))


def preregister_sweep(out: str | Path, *, jobs: int = 1, log=print, **options) -> list[Path]:
    """Preregister the dP study ``options`` describe (:func:`dp_spec`'s arguments) in the new folder ``out``:
    ``sweep.json`` with its design and analysis frozen, and ``PLAN.md``; nothing runs
    (:mod:`plelab.sweeps.preregister`). Commit both, then :func:`sweep` with the same options runs it."""
    if jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    root = Path(out)
    return preregister(root, merge_spec(root, dp_spec(**options, existing=load_spec(root))), jobs=jobs, log=log)


def lr_search(out: str | Path, *, mults: Sequence[float] = DEFAULT_MULTS, search_seeds: Sequence[int] = DEFAULT_SEEDS,
              at_dp: int | None = None, jobs: int = 1, progress: bool = True, **options) -> dict:
    """Run (or resume) the per-arm learning-rate search in ``out`` for the dP study ``options`` describe
    (:func:`dp_spec`'s arguments), on ``search_seeds`` kept apart from the study's; write and return the choice
    (:func:`plelab.sweeps.lr_search.choose`)."""
    if jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    if options.get("lr_from") is not None:
        raise ConfigError("--lr-from belongs to the study the search feeds, not to the search")
    root = Path(out)
    spec = merge_spec(root, lr_spec(dp_spec(**options), mults, search_seeds, at_dp))
    run_sweep(root, spec, jobs=jobs, progress=progress)
    choice = choose(collect(root, structure=False))
    write_choice(root, choice)
    return choice


# kinds of sweep whose weights hold more than the run records carry -> the module whose ``carry(root)`` writes it
# beside the records before a pack (loaded by name: it lives in a higher layer)
CARRY_MODULES = {"calibrate": "plelab.calibration.evidence"}


def pack(src: str | Path, dest: str | Path) -> dict:
    """Carry the sweep in ``src`` (or every sweep under it, e.g. a ``plelab demo --long`` folder) without its weights:
    write the record of every finished run that has none (:mod:`plelab.sweeps.records`) and, for a calibrate
    regime, the evidence of every finished arm (:data:`CARRY_MODULES`), then copy each sweep's ``sweep.json``,
    ``records/`` and ``evidence/`` to the same place under ``dest``. To resume elsewhere, copy ``dest`` there and
    rerun the study's command with ``--out`` at the copy: the recorded runs count as finished. Returns
    ``{"sweeps", "records", "written", "evidence", "held"}`` (``held``: finished runs of an unfinished calibrate arm,
    left behind to train again with their arm)."""
    src, dest = Path(src), Path(dest)
    roots = sweep_roots(src) if src.is_dir() else []
    if not roots:
        raise PlelabError(f"{src} holds no plelab sweep (no sweep.json in it or below); give a sweep's --out folder")
    if dest.resolve() == src.resolve() or src.resolve() in dest.resolve().parents:
        raise PlelabError(f"{dest} is inside {src}: pack into a folder outside the sweep")
    written = evidence = 0
    held: list[Path] = []
    for root in roots:
        spec = load_spec(root)
        for job in jobs_of(root, spec):
            if folder_done(job) and not record_path(job.path).is_file():
                record_finished(job)
                written += 1
        if spec.kind in CARRY_MODULES:
            n, left = importlib.import_module(CARRY_MODULES[spec.kind]).carry(root)
            evidence, held = evidence + n, held + left
    return {"sweeps": len(roots), "records": copy_records(src, dest, skip=held), "written": written,
            "evidence": evidence, "held": sum(p.is_file() for p in held)}
