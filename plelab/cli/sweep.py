"""The study engine's verbs: ``plelab sweep``, ``report``, ``advise``, ``plan``, ``demo``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from plelab.cli.common import (add_set, config_args, dp_list, dp_value, float_list, int_list, one_int, trunk_args,
                               trunk_settings)
from plelab.config import config_file_overrides, read_config_file
from plelab.config.paths import absolute, path_keys, portable_mapping, portable_override, portable_overrides
from plelab.demo import PROFILES, run_demo
from plelab.errors import ConfigError
from plelab.io import json_safe, write_json
from plelab.reports.study import report
from plelab.stats.advise import advise
from plelab.sweeps.commands import DEFAULT_PRESET, lr_search, options_of, pack, preregister_sweep, sweep
from plelab.scaling.ladder import GPU_BF16_PEAK, Assumptions, ladder, ladder_text
from plelab.sweeps.lr_search import CHOICE_FILE, DEFAULT_MULTS, DEFAULT_SEEDS, choice_text
from plelab.stats.planning import FAMILIES, plan, plan_text
from plelab.sweeps.runner import say
from plelab.scaling.scaling_runs import fit_runs, fit_text
from plelab.sweeps.spec import CONTROLS, load_spec


def variant(text: str) -> tuple[str, list[str]]:
    """``--variant NAME:section.key=value[,section.key=value]`` -> ``(NAME, [overrides])``."""
    name, sep, body = text.partition(":")
    if not sep or not name or not body or not name.replace("-", "").replace("_", "").isalnum():
        raise ConfigError(f"invalid --variant {text!r}: write NAME:section.key=value[,section.key=value], "
                          "e.g. scalar:ple.gate=scalar")
    return name, [x.strip() for x in body.split(",") if x.strip()]


def controls(text: str) -> list[str] | str:
    """``--controls frozen,zero`` or ``--controls all``."""
    return "all" if text == "all" else [c.strip() for c in text.split(",") if c.strip()]


def portable_options(args: argparse.Namespace) -> dict:
    """The study's options (:func:`~plelab.sweeps.commands.options_of`) with their paths absolute — ``--data``, the
    path-like ``--set`` / ``--variant`` values and a ``--config`` file's paths (:mod:`plelab.config.paths`) — so that
    ``sweep.json`` and the report's "Reproduce" line name the same files from any directory. A sweep already in
    ``--out`` that recorded one of them as typed (relative) keeps them as typed: it continues as it was defined."""
    typed = options_of(args)
    data_keys = [f"data.{key}={value}" for key, value in (("text_field", getattr(args, "text_field", None)),
                                                           ("tokenizer", getattr(args, "tokenizer", None))) if value]
    if data_keys and not typed["data"]:
        raise ConfigError("--text-field and --tokenizer describe the text --data gives; add --data PATH or drop them")
    trunk = [f"{key}={value}" for key, value in trunk_settings(args).items() if value]
    typed["overrides"] = [*(typed["overrides"] or []), *data_keys, *trunk]
    options = {**typed, "data": absolute(typed["data"]) if typed["data"] else typed["data"],
               "overrides": portable_overrides(typed["overrides"] or []),
               "variants": [(name, portable_overrides(extra)) for name, extra in typed["variants"] or []]}
    file_paths: list[str] = []
    if typed["config"] is not None:
        file = read_config_file(typed["config"])
        moved = portable_mapping(file)
        if moved != file:
            options["config"] = moved
            file_paths = [o for o in config_file_overrides(file, typed["preset"], DEFAULT_PRESET)[1]
                          if o.partition("=")[0] in path_keys()]
    given = [*([f"data.path={typed['data']}"] if typed["data"] else []), *(typed["overrides"] or []),
             *[o for _, extra in typed["variants"] or [] for o in extra], *file_paths]
    relative = [o for o in given if portable_override(o) != o]
    stored = load_spec(Path(args.out)) if relative else None
    if stored is not None:
        recorded = {*stored.overrides, *(o for arm in stored.arms for o in arm.overrides)}
        if any(o.strip() in recorded or o in recorded for o in relative):
            return typed
    return options


def cmd_sweep(args: argparse.Namespace) -> int:
    root = Path(args.out)
    if args.preregister:
        if args.emit:
            raise ConfigError("--preregister writes the plan and runs nothing; drop --emit (emit after committing it)")
        written = preregister_sweep(root, jobs=args.jobs, **portable_options(args))
        print("\n".join(f"wrote {p}" for p in written))
        print(f"commit {root}/sweep.json and {root}/PLAN.md now (git add {root} && git commit), then rerun this "
              "command without --preregister to run the study")
        return 0
    script = sweep(root, jobs=args.jobs, emit=args.emit, progress=not args.no_progress, nodes=args.nodes, log=say,
                   **portable_options(args))
    if args.emit:
        print(f"wrote {script}; when the runs are done: plelab report {root}")
    elif not args.no_report:
        print("\n".join(f"wrote {p}" for p in report(root)))
    return 0


def cmd_lr_search(args: argparse.Namespace) -> int:
    choice = lr_search(args.out, mults=args.lr_mults, search_seeds=args.search_seeds, at_dp=args.at_dp, jobs=args.jobs,
                       progress=not args.no_progress, **portable_options(args))
    print(choice_text(choice))
    print(f"wrote {Path(args.out) / CHOICE_FILE}; use it with plelab sweep … --lr-from {args.out}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    print("\n".join(f"wrote {p}" for p in report(Path(args.sweep), delta=args.delta)))
    return 0


def cmd_advise(args: argparse.Namespace) -> int:
    advice = advise(args.sweep, dp=args.dp, preset=args.preset, overrides=args.overrides)
    print(json.dumps(json_safe(advice.to_dict()), indent=1) if args.json else advice.text())
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    if (args.pilot is None) == (args.target is None):
        raise ConfigError("give a pilot sweep (plelab plan PILOT: seeds by power) or --target PRESET --tokens N "
                          "(a scale ladder), not both or neither")
    if args.target is None:
        ladder_only = [f for f, v in (("--tokens", args.tokens), ("--json", args.json)) if v]
        if ladder_only:
            raise ConfigError(f"{ladder_only[0]} belongs to the ladder: add --target PRESET")
        print(plan_text(plan(args.pilot, delta=args.delta, target_power=args.power, out=args.out,
                             eval_windows=args.eval_windows, delta_fraction=args.delta_fraction,
                             families=args.families or "all")))
        return 0
    pilot_only = [f for f, v in (("--delta", args.delta), ("--delta-fraction", args.delta_fraction),
                                 ("--out", args.out), ("--eval-windows", args.eval_windows),
                                 ("--families", args.families)) if v is not None]
    if pilot_only:
        raise ConfigError(f"{pilot_only[0]} belongs to the pilot plan (plelab plan PILOT), not to --target")
    if args.tokens is None:
        raise ConfigError("--target needs --tokens N: the target's training tokens, e.g. --tokens 400e9")
    a = Assumptions(world=args.world, fsdp=not args.ddp, micro_batch=args.micro_batch, seq_len=args.seq_len,
                    mfu=args.mfu, gpu=args.gpu, cpu_budget_hours=args.cpu_hours)
    p = ladder(args.target, args.tokens, a, min_hidden=args.min_hidden, depth=args.depth, vocab=args.vocab,
               count=args.count, emit=args.emit)
    print(json.dumps(p, indent=1) if args.json else ladder_text(p))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    profile = next((p for p, on in (("quick", args.quick), ("study", args.study), ("long", args.long),
                                    ("study-gpu", args.study_gpu)) if on), "default")
    run_demo(profile, out=args.out, data_path=args.data, jobs=args.jobs, progress=not args.no_progress,
             precision=args.precision)
    return 0


def n_and_d(text: str) -> tuple[float, float]:
    """``--predict N:D`` (e.g. ``2.458e9:400e9``) -> ``(N, D)``."""
    try:
        n, d = (float(x) for x in text.split(":"))
        if n > 0 and d > 0:
            return n, d
    except ValueError:
        pass
    raise ConfigError(f"invalid --predict {text!r}: write N:D with both positive, e.g. 2.458e9:400e9")


def cmd_fit(args: argparse.Namespace) -> int:
    r = fit_runs(args.runs, count=args.count, boots=args.boots, min_sizes=args.min_sizes,
                 min_budgets=args.min_budgets, predict=args.predict or ())
    if args.out:
        write_json(args.out, r)
    print(json.dumps(json_safe(r), indent=1) if args.json else fit_text(r))
    if args.out:
        print(f"wrote {args.out}")
    return 0


def cmd_pack(args: argparse.Namespace) -> int:
    r = pack(args.src, args.dest)
    print(f"packed {r['records']} finished run(s) of {r['sweeps']} sweep(s) into {args.dest} ({r['written']} record(s) "
          f"written now" + (f"; evidence of {r['evidence']} finished calibrate arm(s)" if r["evidence"] else "")
          + (f"; {r['held']} finished run(s) of unfinished calibrate arms left to train again with their arm"
             if r["held"] else "")
          + "); copy it back and rerun the study's command with --out at the copy to resume")
    return 0


def study_args(p) -> None:
    """The options that define a dP study (:func:`plelab.sweeps.commands.dp_spec`): ``plelab sweep`` and
    ``plelab lr-search`` (which tunes the study they describe) share them."""
    config_args(p, preset="cpu-sweep", seed=False)
    p.add_argument("--dp", type=dp_list,
                   help="comma-separated dP values including the baseline 0 (default 0 and the preset's)")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per arm (default 3)")
    p.add_argument("--seed-list", type=int_list("--seed-list", "0,1,2"),
                   help="explicit comma-separated seeds instead of --seeds")
    p.add_argument("--controls", type=controls, default=[],
                   help=f"comma-separated controls: {', '.join(CONTROLS)}, or all (docs/dp-studies.md: what each one tests)")
    p.add_argument("--control-dp", type=one_int("--control-dp", "16"),
                   help="the dP of the table-lr, boost and trunk-params/-flops controls (default: the middle dP)")
    p.add_argument("--variant", dest="variants", type=variant, action="append", default=[],
                   metavar="NAME:KEY=VALUE[,KEY=VALUE]",
                   help="an extra arm family crossed with every dP > 0, e.g. scalar:ple.gate=scalar")
    p.add_argument("--aux", action="append", default=[], metavar="KIND[:KEY=VALUE...]",
                   help="an arm of another kind of the table family, compared with the baseline: value, ngram or "
                        "modulation with its aux.* sizes, e.g. --aux ngram:rows=2003:heads=2, or ngram:match=16 for "
                        "the rows that add what PLE at dP 16 adds (repeatable: one arm each; plelab params --aux "
                        "counts them)")
    p.add_argument("--budgets", type=float_list("--budgets", "1.25,1.5"), default=[],
                   help="the baseline also trained at these multiples (> 1) of the steps, each a run of its own: the "
                        "budget ladder on which the report reads each table arm at equal wall clock and what it is "
                        "worth in baseline tokens, e.g. 1.25,1.5")
    p.add_argument("--steps", type=int, help="optimizer steps per run (equal token budget for every arm)")
    p.add_argument("--data", help="your text instead of the embedded corpus (as for plelab train)")
    p.add_argument("--text-field", help="with --data: the JSONL field / Parquet column holding the text (default "
                                        "'text', as for plelab train)")
    p.add_argument("--tokenizer", help="with --data: its tokenizer.json, or a folder holding one (as for plelab train)")
    trunk_args(p)
    p.add_argument("--delta", type=float,
                   help="smallest effect of interest δ in nats for the equivalence tests (default 0.005: below the "
                        "seed's dP 0→64 gain of 0.006); fixed in the sweep's analysis plan when it is created")
    p.add_argument("--last-k", type=int,
                   help="a run's loss = mean of its last k evaluations (default 3); fixed in the analysis plan")
    p.add_argument("--lr-from", metavar="LRSEARCH",
                   help="each arm group's learning rate from a finished plelab lr-search folder (its lr.json)")


def add_parsers(sub) -> None:
    p = sub.add_parser("sweep", help="a paired multi-seed dP study (arms × seeds), resumable, then its report")
    p.set_defaults(func=cmd_sweep)
    study_args(p)
    p.add_argument("--out", required=True, help="the sweep folder (rerun the same command to resume or grow it)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (each gets cores/jobs threads)")
    p.add_argument("--emit", choices=("torchrun", "slurm"),
                   help="write per-run torchrun lines (commands.sh) or a Slurm array (sweep.sbatch) instead of running")
    p.add_argument("--nodes", type=int, default=1,
                   help="with --emit: nodes per run (torchrun's c10d rendezvous; default 1, --standalone)")
    p.add_argument("--no-report", action="store_true", help="do not write the report at the end")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--preregister", action="store_true",
                   help="freeze this study's design and analysis in a new --out (sweep.json + PLAN.md, hashed; needs "
                        "a clean git checkout) and run nothing; commit them, then rerun without it")

    p = sub.add_parser("lr-search", help="a learning rate per arm group (baseline, main curve, each control) for the dP "
                                         "study these options describe, on seeds kept apart from it")
    study_args(p)
    p.add_argument("--lr-mults", type=float_list("--lr-mults", "0.5,1,2"), default=list(DEFAULT_MULTS),
                   help="multipliers of the study's train.lr to try, including 1 (default 0.5,1,2)")
    p.add_argument("--search-seeds", type=int_list("--search-seeds", "1000"), default=list(DEFAULT_SEEDS),
                   help="the search's seeds, none of the study's (default 1000)")
    p.add_argument("--at-dp", type=one_int("--at-dp", "16"),
                   help="the dP each group is tuned at (default the study's control dP, else its middle dP)")
    p.add_argument("--out", required=True, help="the search folder (rerun the same command to resume)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (each gets cores/jobs threads)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_lr_search)

    p = sub.add_parser("report", help="write a sweep's report: HTML (self-contained) + Markdown + CSV/JSON")
    p.add_argument("sweep", help="the sweep folder")
    p.add_argument("--delta", type=float,
                   help="read a dP study at another margin than its analysis plan's: a post-hoc sensitivity analysis, "
                        "written to SWEEP/report-posthoc-delta-X/ and labelled so")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("advise", help="recommend dP from a finished sweep (never beyond what it measured)")
    p.add_argument("sweep", help="the sweep folder")
    p.add_argument("--dp", type=dp_value, help="ask about this dP instead")
    p.add_argument("--preset", help="the configuration you want to use (default: the sweep's own)")
    add_set(p, "that configuration's fields")
    p.add_argument("--json", action="store_true", help="print the advice as JSON (status, recommendation, each "
                                                       "comparison and the seeds that would decide it)")
    p.set_defaults(func=cmd_advise)

    p = sub.add_parser("plan", help="seeds a confirmatory sweep needs (from a pilot sweep), or a scale ladder to a "
                                    "target (--target PRESET --tokens N)")
    p.add_argument("pilot", nargs="?", help="a finished pilot sweep (its seeds are not reused)")
    p.add_argument("--target", help="ladder: the target preset, e.g. seed-3b")
    p.add_argument("--tokens", type=float, help="ladder: the target's training tokens, e.g. 400e9")
    p.add_argument("--gpu", default="h100", choices=sorted(GPU_BF16_PEAK), help="ladder: GPU (default h100)")
    p.add_argument("--mfu", type=float, default=0.4, help="ladder: model FLOPs utilisation assumed (default 0.4)")
    p.add_argument("--world", type=int, default=8, help="ladder: data-parallel GPUs (default 8)")
    p.add_argument("--ddp", action="store_true", help="ladder: DDP replicas instead of an FSDP-sharded trunk")
    p.add_argument("--micro-batch", type=int, default=1, help="ladder: sequences per GPU per micro-step (default 1)")
    p.add_argument("--seq-len", type=int, help="ladder: tokens per sequence (default: the target preset's)")
    p.add_argument("--min-hidden", type=int, default=128, help="ladder: the smallest rung's width floor (default 128)")
    p.add_argument("--depth", choices=("scaled", "fixed"), default="scaled",
                   help="ladder: scaled holds H/L (default), fixed holds L")
    p.add_argument("--vocab", choices=("scaled", "fixed"), default="scaled",
                   help="ladder: scaled holds V/H (default), fixed keeps the target's tokenizer")
    p.add_argument("--count", choices=("total", "non-embedding"), default="total",
                   help="ladder: the N of tokens per parameter (default total: with embeddings, as the seed counts)")
    p.add_argument("--cpu-hours", type=float, default=24.0,
                   help="ladder: CPU-hours one run of a CPU-affordable rung may take (default 24)")
    p.add_argument("--emit", choices=("torchrun", "slurm"), default="torchrun",
                   help="ladder: what the GPU rungs' sweep commands write (default torchrun)")
    p.add_argument("--json", action="store_true", help="ladder: print JSON with a list of rungs")
    p.add_argument("--delta", type=float, help="the smallest effect of interest in nats (default: the pilot's δ)")
    p.add_argument("--delta-fraction", type=float,
                   help="δ = this fraction of the pilot's largest mean gain over the baseline (instead of --delta)")
    p.add_argument("--power", type=float, default=0.8, help="target power of each decision (default 0.8)")
    p.add_argument("--out", help="the confirmatory sweep's folder, for the printed command (default PILOT-confirm)")
    p.add_argument("--eval-windows", type=int,
                   help="also measure the spread with this many validation windows (re-evaluates every run)")
    p.add_argument("--families", choices=FAMILIES,
                   help="comparisons to size: all (default), main (the dP curve) or controls (each against its "
                        "reference)")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("fit", help="scaling law L(N, D) of finished baseline runs (≥ 4 sizes × 3 token budgets), "
                                   "each PLE arm as an effective-parameter multiplier, checked on the largest size")
    p.add_argument("runs", nargs="+", help="run or sweep folders (every summary.json under them is a point)")
    p.add_argument("--count", choices=("non-embedding", "total"), default="non-embedding",
                   help="N without (default) or with the embedding and head parameters")
    p.add_argument("--boots", type=int, default=200, help="bootstrap replicates for the intervals (default 200)")
    p.add_argument("--min-sizes", type=int, default=4, help="trunk sizes the law needs (default 4)")
    p.add_argument("--min-budgets", type=int, default=3, help="token budgets per size the law needs (default 3)")
    p.add_argument("--predict", type=n_and_d, action="append", metavar="N:D",
                   help="also predict the baseline's loss at N parameters and D tokens (repeatable)")
    p.add_argument("--json", action="store_true", help="print the fit as JSON")
    p.add_argument("--out", help="also write the fit as JSON to this file")
    p.set_defaults(func=cmd_fit)

    p = sub.add_parser("pack", help="carry a sweep or study without its weights: every finished run's record and "
                                    "sweep.json, to resume or report on another machine")
    p.add_argument("src", help="the sweep folder (or a folder of sweeps, e.g. plelab demo --long's --out)")
    p.add_argument("dest", help="where the records go (outside src); rerun the study with --out at a copy of it")
    p.set_defaults(func=cmd_pack)

    p = sub.add_parser("demo", help="the seed's accounting + a paired multi-seed dP study with diagnostics and report")
    p.set_defaults(func=cmd_demo)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--quick", action="store_true", help=f"the smoke test ({PROFILES['quick'].about})")
    which.add_argument("--study", action="store_true",
                       help=f"a real study: 5 dP × 6 seeds + all controls ({PROFILES['study'].about})")
    which.add_argument("--long", action="store_true",
                       help=f"past the toy regime on the packages corpus, the seed's gate, iid and zero controls "
                            f"({PROFILES['long'].about})")
    which.add_argument("--study-gpu", action="store_true",
                       help=f"the study at gpu-125m ({PROFILES['study-gpu'].about})")
    p.add_argument("--data", help="your own text file or folder instead of the embedded corpus")
    p.add_argument("--out", help="the sweep folder (default runs/demo-PROFILE-DATE-TIME; rerun to resume)")
    p.add_argument("--jobs", type=int, help="worker processes (default: one per core, up to 8; 1 on a GPU)")
    p.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                   help="every run's train.precision (default auto: the study rule, bf16 on CUDA and fp32 on CPU; "
                        "fp32 | bf16 force it)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
