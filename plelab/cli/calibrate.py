"""``plelab calibrate``: the verdict's labelled benchmark and its held-out error rates."""

from __future__ import annotations

import argparse
import json

from plelab.calibration.benchmark import SCALES, Benchmark
from plelab.calibration.commands import calibrate
from plelab.calibration.report import calibration_text
from plelab.cli.common import int_list, names
from plelab.errors import ConfigError
from plelab.io import json_safe


def corpus(text: str) -> tuple[str, str]:
    """``--corpus NAME=PATH``."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise ConfigError(f"invalid --corpus {text!r}: write NAME=PATH, e.g. kjv=corpora/kjv.txt")
    return name, path


def cmd_calibrate(args: argparse.Namespace) -> int:
    corpora = dict(args.corpus or [])
    if len(corpora) != len(args.corpus or []):
        raise ConfigError("--corpus names a corpus twice; give each corpus one NAME")
    result = calibrate(args.out, quick=args.quick, jobs=args.jobs, corpora=corpora, planted=args.planted,
                       scales=args.scales,
                       seeds=args.seeds, steps=args.steps, dims=args.dims, write_thresholds=args.write_thresholds,
                       progress=not args.no_progress)
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
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--write-thresholds", action="store_true",
                   help="refit the thresholds the verdict ships with (plelab/diagnostics/calibration.json)")
    p.add_argument("--json", action="store_true", help="print calibration.json instead of the report")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_calibrate)
