"""``plelab visual-ids`` and ``plelab visual-study``: visual tokenizers and the study of visual-ID methods."""

from __future__ import annotations

import argparse

from plelab.cli.common import add_set, dp_value, names
from plelab.config import parse_numbers
from plelab.reports.tables import format_table
from plelab.visual.commands import visual_ids, visual_study


def cmd_visual_ids(args: argparse.Namespace) -> int:
    res = visual_ids(k=args.k, scenes=args.scenes, seed=args.seed, image_size=args.image_size, patch=args.patch,
                     data=args.data, siglip=args.siglip, out=args.out)
    k, m = res["k"], res["patches"]
    table = [[r["method"], f"{r['utilisation']:.3f} (uniform {r['uniform_baseline']:.3f})",
              f"{r['perplexity']:.1f} / {k}", f"{r['nmi']:.3f}" if "nmi" in r else "— (no labels)"]
             for r in res["rows"]]
    print(format_table(["method", "utilisation", "perplexity", "NMI with patch labels"], table,
                       title=f"Visual IDs, K={k}, scored on {m:,} held-out patches (M/K = {m / k:.0f})"))
    if args.out:
        print(f"fitted tokenizers saved in {args.out}/")
    return 0


def cmd_visual_study(args: argparse.Namespace) -> int:
    paths = visual_study(args.out, quick=args.quick, design=args.design, methods=args.methods, lambdas=args.lambdas,
                         features=not args.no_features, seeds=args.seeds, dp=args.dp, config=args.config,
                         overrides=args.overrides, gate=args.gate, jobs=args.jobs, progress=not args.no_progress)
    print("\n".join(f"wrote {p}" for p in paths))
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("visual-ids", help="fit offline visual tokenizers (DCT + K-means) and score their IDs")
    p.add_argument("--k", type=int, default=64, help="number of visual IDs, the same for every method (default 64)")
    p.add_argument("--scenes", type=int, default=2000, help="embedded scenes to fit on (default 2000)")
    p.add_argument("--seed", type=int, default=0, help="scene and K-means seed (default 0)")
    p.add_argument("--image-size", type=int, default=48, help="image side in pixels (default 48)")
    p.add_argument("--patch", type=int, default=8, help="patch side in pixels (default 8)")
    p.add_argument("--data", help="your image–caption pairs (.jsonl or a folder) instead of the embedded scenes")
    p.add_argument("--siglip", help="a local transformers SigLIP checkpoint folder for the feature K-means "
                                    "(default: a tiny ViT SigLIP-pretrained on the same data, cached)")
    p.add_argument("--out", help="save the fitted tokenizers (safetensors) into this folder")
    p.set_defaults(func=cmd_visual_ids)

    p = sub.add_parser("visual-study", help="paired multi-seed study of visual-ID methods (text-only loss)")
    p.add_argument("--quick", action="store_true", help="the CI smoke test (tiny runs, 2 seeds)")
    p.add_argument("--design", choices=("tokenizers", "fix", "ablation"), default="tokenizers",
                   help="tokenizers: every method under the text-only loss (default); fix: the 2×2 of visual table "
                        "on/off × L_visual on/off; ablation: features withheld, per-layer table vs layer-0 embedding")
    p.add_argument("--methods", type=names("--methods"),
                   help="comma-separated, always with none: none, dct-kmeans, siglip-kmeans, random, oracle, "
                        "vq/lfq/bsq-online, vq/lfq/bsq-frozen (default: the design's set)")
    p.add_argument("--lambdas", type=lambda text: parse_numbers(text, "--lambdas", item=float, example="0.1,0.5,1"),
                   default="0.1,0.5,1", help="λ values of L_visual for --design fix (default 0.1,0.5,1)")
    p.add_argument("--no-features", action="store_true",
                   help="withhold the continuous patch features in every arm (the IDs are the image's only view; "
                        "always so in --design ablation)")
    p.add_argument("--gate", action=argparse.BooleanOptionalAction, default=None,
                   help="run the positive control (oracle) and its null (random IDs) that gate the findings "
                        "(default: whenever the oracle can run: the embedded scenes, visual.k >= 37); --no-gate: "
                        "an ungated study")
    p.add_argument("--seeds", type=int, help="seeds per method (default 3; 2 with --quick)")
    p.add_argument("--dp", type=dp_value, default=16, help="dP of the text and visual per-layer tables (default 16)")
    p.add_argument("--config", metavar="FILE",
                   help="a JSON or TOML config file (a run's config.json, or any subset of its keys) as the base "
                        "below the study's profile; --set applies on top of everything")
    add_set(p, "any config field of every arm")
    p.add_argument("--out", help="the study folder (default runs/visual-PROFILE-DATE; rerun to resume)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_visual_study)
