"""CLI verbs of the study engine: ``plelab sweep``, ``plelab report``, ``plelab advise``."""

from __future__ import annotations

import argparse
from pathlib import Path

from plelab.errors import ConfigError, PlelabError


def _int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"invalid {what} {text!r}: give integers separated by commas, e.g. 0,1,2") from None
    if not values:
        raise ConfigError(f"invalid {what} {text!r}: give at least one integer")
    return values


def _variants(items: list[str]) -> dict[str, list[str]]:
    out = {}
    for item in items:
        name, sep, body = item.partition(":")
        if not sep or not name or not body or not name.replace("-", "").replace("_", "").isalnum():
            raise ConfigError(f"invalid --variant {item!r}: write NAME:section.key=value[,section.key=value], "
                              "e.g. scalar:ple.gate=scalar")
        out[name] = [x.strip() for x in body.split(",") if x.strip()]
    return out


def dp_spec_from_args(args: argparse.Namespace, existing=None):
    """The :class:`SweepSpec` that ``plelab sweep`` arguments describe (validated, nothing written).
    ``existing``: the spec already in the folder — its control placement is kept when not given."""
    from plelab.config import resolve_config
    from plelab.sweep.spec import CONTROLS, SweepSpec, dp_arms

    overrides = list(args.overrides)
    if args.data:
        overrides.append(f"data.path={args.data}")
    preset_cfg = resolve_config(args.preset, overrides, gate=args.gate)
    steps = args.steps if args.steps is not None else preset_cfg.train.steps
    early = preset_cfg.train.early_checkpoint
    if not 0 < early <= steps // 2 and not any(o.startswith("train.early_checkpoint=") for o in overrides):
        overrides.append(f"train.early_checkpoint={steps // 4}")  # the early verdict at a quarter (0 = none)
    base = resolve_config(args.preset, overrides, gate=args.gate, steps=args.steps)
    dims = _int_list(args.dp, "--dp") if args.dp else [0, base.ple.dim]
    if any(d < 0 for d in dims):
        raise ConfigError(f"invalid --dp {args.dp!r}: dP values are >= 0")
    controls = list(CONTROLS) if args.controls == "all" else [c.strip() for c in (args.controls or "").split(",")
                                                                if c.strip()]
    seeds = _int_list(args.seed_list, "--seed-list") if args.seed_list else list(range(args.seeds))
    if len(seeds) < 1 or args.seeds < 1:
        raise ConfigError("--seeds must be >= 1 (3 or more for any statistics)")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seed-list {args.seed_list!r} repeats a seed; each seed is one run per arm")
    if args.gate:
        overrides.append(f"ple.gate={args.gate}")
    positive = sorted(d for d in set(dims) if d > 0)
    control_dp = args.control_dp if args.control_dp is not None else (
        existing.control_dp if existing is not None and existing.control_dp is not None
        else (positive[len(positive) // 2] if positive else None))
    matched_ref = existing.matched_ref if existing is not None and existing.matched_ref is not None else (
        positive[0] if positive else None)
    arms = dp_arms(dims, controls, control_dp, _variants(args.variant), matched_ref=matched_ref)
    if args.delta <= 0:
        raise ConfigError(f"--delta must be > 0 (the smallest effect of interest in nats), got {args.delta}")
    return SweepSpec(preset=args.preset, overrides=overrides, arms=arms, seeds=seeds, steps=args.steps,
                     last_k=args.last_k, delta=args.delta, control_dp=control_dp, matched_ref=matched_ref)


def cmd_sweep(args: argparse.Namespace) -> int:
    from plelab.sweep.runner import emit_scripts, run_sweep
    from plelab.sweep.spec import load_spec, merge_spec

    if args.jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {args.jobs}")
    if args.last_k < 1:
        raise ConfigError(f"--last-k must be >= 1, got {args.last_k}")
    root = Path(args.out)
    spec = merge_spec(root, dp_spec_from_args(args, existing=load_spec(root)))
    if args.emit:
        path = emit_scripts(root, spec, args.emit)
        print(f"wrote {path}; when the runs are done: plelab report {root}")
        return 0
    run_sweep(root, spec, jobs=args.jobs, progress=not args.no_progress)
    if not args.no_report:
        _report(root)
    return 0


def _report(root: Path) -> None:
    from plelab.report.sweep import write_report
    from plelab.sweep.spec import load_spec

    spec = load_spec(root)
    if spec is not None:
        from plelab.io import check_folder_target

        check_folder_target(root / "report", "report folder", "move it away and rerun plelab report")
    if spec is not None and spec.kind == "visual":
        from plelab.report.visual import write_visual_report

        paths = write_visual_report(root)
    else:
        paths = write_report(root)
    print("\n".join(f"wrote {p}" for p in paths))


def cmd_report(args: argparse.Namespace) -> int:
    _report(Path(args.sweep))
    return 0


def cmd_advise(args: argparse.Namespace) -> int:
    from plelab.sweep.advise import advise
    from plelab.sweep.spec import load_spec

    target = None
    if args.preset or args.overrides:
        from plelab.config import resolve_config

        spec = load_spec(Path(args.sweep))
        if spec is None:
            raise PlelabError(f"{args.sweep} is not a plelab sweep (no sweep.json); give a sweep folder")
        if args.preset:  # another configuration: compared as given
            target = resolve_config(args.preset, args.overrides)
        else:  # the sweep's own configuration with changes
            target = resolve_config(spec.preset, [*spec.overrides, *args.overrides], steps=spec.steps)
    print(advise(Path(args.sweep), target=target, dp=args.dp, target_name=args.preset or "that configuration"))
    return 0


def add_sweep_parsers(sub, config_args) -> None:
    p = sub.add_parser("sweep", help="a paired multi-seed dP study (arms × seeds), resumable, then its report")
    config_args(p, preset="cpu-sweep", seed=False)
    p.set_defaults(func=cmd_sweep)
    p.add_argument("--dp", help="comma-separated dP values including the baseline 0 (default 0 and the preset's)")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per arm (default 3)")
    p.add_argument("--seed-list", help="explicit comma-separated seeds instead of --seeds")
    p.add_argument("--controls", help="comma-separated controls: frozen, zero, matched, table-lr, boost, or all")
    p.add_argument("--control-dp", type=int, help="the dP of the table-lr and boost controls (default: the middle)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE[,KEY=VALUE]",
                   help="an extra arm family crossed with every dP > 0, e.g. scalar:ple.gate=scalar")
    p.add_argument("--steps", type=int, help="optimizer steps per run (equal token budget for every arm)")
    p.add_argument("--data", help="your text instead of the embedded corpus (as for plelab train)")
    p.add_argument("--delta", type=float, default=0.02,
                   help="smallest effect of interest δ in nats for the equivalence tests (default 0.02)")
    p.add_argument("--last-k", type=int, default=3, help="a run's loss = mean of its last k evaluations (default 3)")
    p.add_argument("--out", required=True, help="the sweep folder (rerun the same command to resume or grow it)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (each gets cores/jobs threads)")
    p.add_argument("--emit", choices=("torchrun", "slurm"),
                   help="write per-run torchrun lines (commands.sh) or a Slurm array (sweep.sbatch) instead of running")
    p.add_argument("--no-report", action="store_true", help="do not write the report at the end")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")

    p = sub.add_parser("report", help="write a sweep's report: HTML (self-contained) + Markdown + CSV/JSON")
    p.add_argument("sweep", help="the sweep folder")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("advise", help="recommend dP from a finished sweep (never beyond what it measured)")
    p.add_argument("sweep", help="the sweep folder")
    p.add_argument("--dp", type=int, help="ask about this dP instead")
    p.add_argument("--preset", help="the configuration you want to use (default: the sweep's own)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="overrides of that configuration")
    p.set_defaults(func=cmd_advise)

