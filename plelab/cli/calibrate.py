"""``plelab calibrate``: the verdict's labelled benchmark and its held-out error rates; ``plelab validate``: a
preregistered validation of its frozen thresholds beyond the benchmark."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from plelab.calibration.benchmark import MECHANISMS, SCALES, Benchmark
from plelab.calibration.commands import calibrate
from plelab.calibration.report import calibration_text
from plelab.calibration.validation import RUNGS, ValidationDesign, preregister_validation, run_validation
from plelab.calibration.validation_report import validation_result
from plelab.cli.common import int_list, names
from plelab.diagnostics.verdict import SHIPPED
from plelab.errors import ConfigError
from plelab.io import json_safe


def corpus(text: str) -> tuple[str, str]:
    """``--corpus NAME=PATH``."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise ConfigError(f"invalid --corpus {text!r}: write NAME=PATH, e.g. kjv=corpora/kjv.txt")
    return name, path


def kind_list(text: str) -> list[str]:
    """``--kinds value,ngram`` (``none``: no other kind)."""
    kinds = [] if text.strip() == "none" else [k.strip() for k in text.split(",") if k.strip()]
    if not text.strip() or any(k not in MECHANISMS for k in kinds):
        raise ConfigError(f"invalid --kinds {text!r}: comma-separated from {', '.join(MECHANISMS)}, or none")
    return kinds


def cmd_calibrate(args: argparse.Namespace) -> int:
    corpora = dict(args.corpus or [])
    if len(corpora) != len(args.corpus or []):
        raise ConfigError("--corpus names a corpus twice; give each corpus one NAME")
    result = calibrate(args.out, quick=args.quick, jobs=args.jobs, corpora=corpora, planted=args.planted,
                       scales=args.scales,
                       seeds=args.seeds, steps=args.steps, dims=args.dims, kinds=args.kinds,
                       write_thresholds=args.write_thresholds, progress=not args.no_progress)
    print(json.dumps(json_safe(result), indent=1) if args.json else calibration_text(result))
    print(f"wrote {args.out}/calibration.json, calls.jsonl and report.md")
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("calibrate", help="train the verdict's labelled benchmark and measure its held-out error rates")
    p.add_argument("--out", required=True, help="benchmark folder (resumable: rerun to continue)")
    p.add_argument("--quick", action="store_true", help="the CI pipeline check: one tiny scale, 3 seeds, 128 steps "
                                                        "(never rewrites the shipped thresholds)")
    p.add_argument("--corpus", type=corpus, action="append", metavar="NAME=PATH",
                   help="another corpus besides the embedded one (repeatable; e.g. kjv=kjv.txt from "
                        "scripts/kjv_corpus.sh)")
    p.add_argument("--planted", action="store_true",
                   help="also the planted corpus: 4,096 token ids, half of them keys whose next token is a fixed "
                        "value (generated into OUT/corpora; a table learns and benefits by construction)")
    p.add_argument("--scales", type=names("--scales"), help=f"model scales (default all: {', '.join(SCALES)})")
    p.add_argument("--seeds", type=int, help="seeds per configuration (default 4; 3 with --quick; >= 3)")
    p.add_argument("--dims", type=int_list("--dims", "4,8,16"),
                   help="dP values: the smallest holds the small-dP class, every larger one the other classes "
                        f"(default {','.join(map(str, Benchmark().dims))}); a benchmark folder may be extended by "
                        "more, keeping its finished runs")
    p.add_argument("--steps", type=int, help="steps per run, a multiple of 8 (default 320; 128 with --quick)")
    p.add_argument("--kinds", type=kind_list, metavar="KINDS",
                   help=f"the table family's other mechanisms to measure held out by mechanism, comma-separated from "
                        f"{', '.join(MECHANISMS)}, or none (default none; all three with --quick): a real and an "
                        "i.i.d.-keyed table of each at dP 0, scored with PLE's thresholds, never fitting them")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--write-thresholds", action="store_true",
                   help="refit the thresholds the verdict ships with (plelab/diagnostics/calibration.json)")
    p.add_argument("--json", action="store_true", help="print calibration.json instead of the report")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_calibrate)
    add_validate_parser(sub)


def cmd_validate(args: argparse.Namespace) -> int:
    fixed = [flag for flag, given in (("--corpus", args.corpus), ("--rungs", args.rungs), ("--seeds", args.seeds),
                                      ("--calibration", args.calibration)) if given]
    if args.preregister:
        if args.no_run:
            raise ConfigError("--preregister never runs anything; drop --no-run")
        corpora = dict(args.corpus or [])
        if len(corpora) != len(args.corpus or []):
            raise ConfigError("--corpus names a corpus twice; give each corpus one NAME")
        design = ValidationDesign(corpora=corpora)
        if args.rungs:
            unknown = [r for r in args.rungs if r not in RUNGS]
            if unknown:
                raise ConfigError(f"unknown rung {unknown[0]!r}: choose from {', '.join(RUNGS)}")
            design.rungs = {r: design.rungs[r] for r in args.rungs}
        if args.seeds:
            design.seeds = list(args.seeds)
        plan = preregister_validation(args.out, design, args.calibration or SHIPPED, jobs=args.jobs)
        print(f"preregistered {args.out}: plan sha256 {plan['sha256']} at commit {plan['commit'][:12]}; "
              f"{plan['budget']}")
        print(f"wrote {args.out}/plan.json and PLAN.md: commit them, then run plelab validate {args.out} --jobs "
              f"{args.jobs}")
        return 0
    if fixed:
        raise ConfigError(f"{fixed[0]} is fixed by the validation's plan; it applies only with --preregister (a new "
                          "design is a new folder)")
    if not args.no_run:
        run_validation(args.out, jobs=args.jobs, progress=not args.no_progress)
    result = validation_result(args.out, progress=not args.no_progress)
    if args.json:
        print(json.dumps(json_safe(result), indent=1))
    else:
        print((Path(args.out) / "report.md").read_text(), end="")
    print(f"wrote {args.out}/validation.json and report.md")
    return 0


def add_validate_parser(sub) -> None:
    p = sub.add_parser("validate", help="preregister, run and score a validation of the verdict's frozen thresholds "
                                        "beyond its benchmark")
    p.add_argument("out", help="the validation folder (resumable)")
    p.add_argument("--preregister", action="store_true",
                   help="freeze the design and the shipped thresholds into OUT/plan.json and PLAN.md; run nothing "
                        "(a clean checkout only)")
    p.add_argument("--corpus", type=corpus, action="append", metavar="NAME=PATH",
                   help="a corpus never used in development (repeatable; with --preregister)")
    p.add_argument("--rungs", type=names("--rungs"), help=f"rungs (default all: {', '.join(RUNGS)}; with --preregister)")
    p.add_argument("--seeds", type=int_list("--seeds", "100,101,102"), help="seeds (default 100..107; with "
                                                                            "--preregister)")
    p.add_argument("--calibration", help=f"the thresholds to freeze (default the shipped {SHIPPED.name})")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--no-run", action="store_true", help="score what has run, run nothing")
    p.add_argument("--json", action="store_true", help="print validation.json instead of the report")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_validate)

