"""``plelab visual-ids``: fit the offline visual tokenizers and their controls, and score the IDs."""

from __future__ import annotations

import argparse
from pathlib import Path

from plelab.errors import ConfigError, PlelabError


def id_table(k: int, train, held_out, seed: int = 0, out: Path | None = None, encode=None) -> list[dict]:
    """Fit DCT + K-means, SigLIP-feature K-means (with ``encode``), the random control (DCT's
    frequencies) and the oracle (embedded scenes only) on ``train``; score each method's IDs on
    ``held_out``. Saves fitted tokenizers into ``out``."""
    from plelab.visual.ids import DCTKMeans, FeatureKMeans, OracleIDs, RandomIDs
    from plelab.visual.metrics import id_report

    labels = held_out.semantic_labels() if held_out.has_labels else None
    dct = DCTKMeans(k).fit(train, seed)
    methods = [dct]
    if encode is not None:
        methods.append(FeatureKMeans(k, encode).fit(train, seed))
    methods.append(RandomIDs(dct).fit(train, seed))
    if train.has_labels and k >= OracleIDs.NEEDED:
        methods.append(OracleIDs(k).fit(train, seed))
    rows = []
    for m in methods:
        rows.append({"method": m.name, **id_report(m.assign(held_out, seed), k, labels)})
        if out is not None and m.state():
            m.save(out / f"{m.name}.safetensors")
    return rows


def _check_safetensors_folder(path: Path) -> None:
    """Weights are read only from safetensors: a folder with only pickle-based weights (.bin, .pt, .pth, .ckpt,
    .pkl: loading them can run code) is refused before anything is loaded."""
    if not path.is_dir():
        raise PlelabError(f"SigLIP checkpoint folder {path} does not exist or is not a folder (nothing is downloaded)")
    if not any(path.glob("*.safetensors")):
        pickled = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt", ".pkl"))
        found = f" (found {pickled[0]}, a pickle-based format plelab does not load)" if pickled else ""
        raise PlelabError(f"{path} holds no .safetensors weights{found}; save the model with "
                          "save_pretrained(..., safe_serialization=True) and pass that folder")


def cmd_visual_ids(args: argparse.Namespace) -> int:
    from plelab.report.tables import format_table
    from plelab.visual.data import VAL_SEED_OFFSET
    from plelab.visual.loader import load_image_captions, split_pairs
    from plelab.visual.scenes import generate_scenes

    if args.k < 2 or args.scenes < 10:
        raise ConfigError("--k must be >= 2 and --scenes >= 10")
    if args.patch < 1 or args.image_size % args.patch or args.image_size < 2 * args.patch:
        raise ConfigError(f"--image-size {args.image_size} must be a multiple of --patch {args.patch}, "
                          "at least twice it")
    if args.out:
        from plelab.io import check_folder_target

        check_folder_target(args.out, "--out", "give a writable folder for the fitted tokenizers")
    if args.siglip:
        _check_safetensors_folder(Path(args.siglip))
    if args.data:
        train, held = split_pairs(load_image_captions(args.data, args.image_size, args.patch))
    else:
        train = generate_scenes(args.scenes, seed=args.seed, image_size=args.image_size, patch=args.patch)
        held = generate_scenes(max(10, args.scenes // 5), seed=args.seed + VAL_SEED_OFFSET,
                               image_size=args.image_size, patch=args.patch)
    out = Path(args.out) if args.out else None
    from plelab.visual.encoder import HFSiglipEncoder, encode_with, get_encoder

    encoder = HFSiglipEncoder(args.siglip) if args.siglip else get_encoder(train, seed=args.seed, log=print)
    if out is not None:
        from plelab.io import ensure_dir

        ensure_dir(out, "--out", "give a writable folder for the fitted tokenizers")
    rows = id_table(args.k, train, held, args.seed, out, lambda images: encode_with(encoder, images))
    m = held.num_patches * len(held)
    table = [[r["method"], f"{r['utilisation']:.3f} (uniform {r['uniform_baseline']:.3f})",
              f"{r['perplexity']:.1f} / {args.k}", f"{r['nmi']:.3f}" if "nmi" in r else "— (no labels)"]
             for r in rows]
    print(format_table(["method", "utilisation", "perplexity", "NMI with patch labels"], table,
                       title=f"Visual IDs, K={args.k}, scored on {m:,} held-out patches (M/K = {m / args.k:.0f})"))
    if out is not None:
        print(f"fitted tokenizers saved in {out}/")
    return 0


def cmd_visual_study(args: argparse.Namespace) -> int:
    import time

    from plelab.report.visual import write_visual_report
    from plelab.sweep.runner import run_sweep
    from plelab.sweep.spec import merge_spec
    from plelab.visual.study import ABLATION_METHODS, FIX_METHODS, METHODS, visual_spec

    defaults = {"tokenizers": METHODS, "fix": FIX_METHODS, "ablation": ABLATION_METHODS}[args.design]
    methods = [m.strip() for m in args.methods.split(",")] if args.methods else list(defaults)
    bad = [m for m in methods if m not in METHODS]
    if bad or "none" not in methods:
        raise ConfigError(f"invalid --methods {args.methods!r}: choose from {', '.join(METHODS)}, including none "
                          "(the baseline every method is paired with)")
    if args.seeds is not None and args.seeds < 1:
        raise ConfigError("--seeds must be >= 1")
    try:
        lambdas = [float(x) for x in args.lambdas.split(",")]
    except ValueError:
        lambdas = []
    if not lambdas or any(not lam > 0 for lam in lambdas):
        raise ConfigError(f"invalid --lambdas {args.lambdas!r}: comma-separated numbers > 0, e.g. 0.1,0.5,1")
    profile = "quick" if args.quick else "default"
    out = Path(args.out) if args.out else Path("runs") / time.strftime(f"visual-{profile}-%Y%m%d-%H%M%S")
    spec = merge_spec(out, visual_spec(profile, methods, dp=args.dp, seeds=args.seeds, design=args.design,
                                       lambdas=lambdas, features=not args.no_features))
    run_sweep(out, spec, jobs=args.jobs, progress=not args.no_progress)
    paths = write_visual_report(out)
    print("\n".join(f"wrote {p}" for p in paths))
    return 0


def add_visual_parsers(sub) -> None:
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
    p.add_argument("--methods", help="comma-separated, always with none: none, dct-kmeans, siglip-kmeans, random, "
                                     "oracle, vq/lfq/bsq-online, vq/lfq/bsq-frozen (default: the design's set)")
    p.add_argument("--lambdas", default="0.1,0.5,1", help="λ values of L_visual for --design fix (default 0.1,0.5,1)")
    p.add_argument("--no-features", action="store_true",
                   help="withhold the continuous patch features in every arm (the IDs are the image's only view; "
                        "always so in --design ablation)")
    p.add_argument("--seeds", type=int, help="seeds per method (default 3; 2 with --quick)")
    p.add_argument("--dp", type=int, default=16, help="dP of the text and visual per-layer tables (default 16)")
    p.add_argument("--out", help="the study folder (default runs/visual-PROFILE-DATE; rerun to resume)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_visual_study)
