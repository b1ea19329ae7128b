"""The visual verbs as library functions: :func:`visual_ids` (fit the offline visual tokenizers and their
controls, score the IDs) and :func:`visual_study` (the paired multi-seed study of visual-ID methods).

Both take typed Python arguments; :mod:`plelab.cli.visual` converts the command line and prints.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from plelab.config import config_file_overrides, resolve_config
from plelab.config.resolve import ConfigSource
from plelab.errors import ConfigError
from plelab.integrations.pretrained import check_safetensors_folder
from plelab.io import check_folder_target, ensure_dir
from plelab.runtime import check_seed
from plelab.sweeps.runner import run_sweep
from plelab.sweeps.spec import merge_spec
from plelab.visual.data import VAL_SEED_OFFSET
from plelab.visual.encoder import HFSiglipEncoder, encode_with, get_encoder
from plelab.visual.ids import DCTKMeans, FeatureKMeans, OracleIDs, RandomIDs
from plelab.visual.loader import load_image_captions, split_pairs
from plelab.visual.metrics import id_report
from plelab.visual.report import write_visual_report
from plelab.visual.scenes import generate_scenes
from plelab.visual.study import ABLATION_METHODS, DESIGNS, FIX_METHODS, LAMBDAS, METHODS, VISUAL_PROFILES, visual_spec


def id_table(k: int, train, held_out, seed: int = 0, out: Path | None = None, encode=None) -> list[dict]:
    """Fit DCT + K-means, SigLIP-feature K-means (with ``encode``), the random control (DCT's
    frequencies) and the oracle (embedded scenes only) on ``train``; score each method's IDs on
    ``held_out``. Saves fitted tokenizers into ``out``."""
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


def visual_ids(*, k: int = 64, scenes: int = 2000, seed: int = 0, image_size: int = 48, patch: int = 8,
               data: str | None = None, siglip: str | None = None, out: str | Path | None = None, log=print) -> dict:
    """Fit the offline tokenizers (:func:`id_table`) on the embedded scenes (``scenes`` of them, ``seed``) or on
    image–caption pairs ``data``; with ``siglip`` (a local transformers SigLIP folder, safetensors only) the
    feature K-means uses it, else a tiny ViT pretrained on the same data (cached). Saves the fitted tokenizers
    into ``out``. Returns ``{"k", "patches" (held-out patches scored), "rows" (one per method)}``."""
    if k < 2 or scenes < 10:
        raise ConfigError("--k must be >= 2 and --scenes >= 10")
    check_seed(seed, headroom=VAL_SEED_OFFSET)  # the held-out scenes' seed is seed + VAL_SEED_OFFSET
    if patch < 1 or image_size % patch or image_size < 2 * patch:
        raise ConfigError(f"--image-size {image_size} must be a multiple of --patch {patch}, at least twice it")
    if out:
        check_folder_target(out, "--out", "give a writable folder for the fitted tokenizers")
    if siglip:
        check_safetensors_folder(siglip, "a SigLIP vision tower")
    if data:
        train, held = split_pairs(load_image_captions(data, image_size, patch))
    else:
        train = generate_scenes(scenes, seed=seed, image_size=image_size, patch=patch)
        held = generate_scenes(max(10, scenes // 5), seed=seed + VAL_SEED_OFFSET, image_size=image_size, patch=patch)
    out = Path(out) if out else None
    encoder = HFSiglipEncoder(siglip) if siglip else get_encoder(train, seed=seed, log=log)
    if out is not None:
        ensure_dir(out, "--out", "give a writable folder for the fitted tokenizers")
    rows = id_table(k, train, held, seed, out, lambda images: encode_with(encoder, images))
    return {"k": k, "patches": held.num_patches * len(held), "rows": rows}


def visual_study(out: str | Path | None = None, *, quick: bool = False, design: str = "tokenizers",
                 methods: Sequence[str] | None = None, lambdas: Sequence[float] = LAMBDAS, features: bool = True,
                 seeds: int | None = None, dp: int = 16, config: ConfigSource = None, overrides: Sequence[str] = (),
                 gate: bool | None = None, jobs: int = 1, progress: bool = True) -> list[Path]:
    """Run (or resume) the visual study in ``out`` (default ``runs/visual-PROFILE-DATE-TIME``) and write its
    report; returns the report's files. ``design``: ``tokenizers`` | ``fix`` | ``ablation``; ``methods``
    (always with ``none``; default the design's set); ``lambdas``: λ of L_visual for the fix; ``config``: a
    JSON / TOML file (or dict) as the base below the study's profile, ``overrides`` (``section.key=value``) on
    top of everything. ``gate``: run the positive control (oracle) and its null (random IDs) that gate the study's
    findings; default: whenever the oracle can run (the embedded scenes, ``visual.k`` ≥ 37)."""
    if design not in DESIGNS:
        raise ConfigError(f"invalid design {design!r}: choose from {', '.join(DESIGNS)}")
    chosen = list(methods) if methods else list({"tokenizers": METHODS, "fix": FIX_METHODS,
                                                 "ablation": ABLATION_METHODS}[design])
    if any(m not in METHODS for m in chosen) or "none" not in chosen:
        raise ConfigError(f"invalid --methods {','.join(chosen)!r}: choose from {', '.join(METHODS)}, including none "
                          "(the baseline every method is paired with)")
    if seeds is not None and seeds < 1:
        raise ConfigError("--seeds must be >= 1")
    if not lambdas or any(not lam > 0 for lam in lambdas):
        raise ConfigError(f"invalid --lambdas {','.join(map(str, lambdas))!r}: comma-separated numbers > 0, "
                          "e.g. 0.1,0.5,1")
    if jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    profile = "quick" if quick else "default"
    preset, base = config_file_overrides(config, None, VISUAL_PROFILES[profile].preset)
    out = Path(out) if out else Path("runs") / time.strftime(f"visual-{profile}-%Y%m%d-%H%M%S")
    options = dict(dp=dp, seeds=seeds, design=design, lambdas=list(lambdas), features=features, preset=preset,
                   base=base, overrides=list(overrides))
    spec = visual_spec(profile, chosen, **options)
    v = resolve_config(spec.preset, [*spec.overrides, *spec.arm("none").overrides], steps=spec.steps).visual
    possible = v.data is None and v.k >= OracleIDs.NEEDED
    if gate and not possible:
        raise ConfigError(f"--gate needs the oracle, which needs the embedded scenes (no visual.data) and visual.k >= "
                          f"{OracleIDs.NEEDED}; drop --gate (the report then says the study is ungated)")
    if gate or (gate is None and possible):
        spec = visual_spec(profile, chosen, **options, gate=True)
    run_sweep(out, merge_spec(out, spec), jobs=jobs, progress=progress)
    return write_visual_report(out)
