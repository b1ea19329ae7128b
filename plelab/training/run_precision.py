"""A run's precision, in one place: resolved once for training (``train.precision`` through
:func:`plelab.precision.resolve_precision` with the run's own GEMM shapes, or, for a resumed run, the precision its
``config.json`` recorded — never probed again), read back for evaluation (:func:`eval_precision`), and read from
started run folders by a sweep (:func:`recorded_precision`; the study rule is :func:`plelab.precision.study_precision`).

Runs written before precision was resolved recorded ``auto``, which then meant bf16 on CUDA and fp32 elsewhere;
:func:`legacy_precision` reads it so.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from plelab.config.schema import RunConfig
from plelab.model.accounting import forward_gemms
from plelab.model.init import build_model
from plelab.precision import PrecisionChoice, cpu_bf16_flags, resolve_precision, step_gemms


def legacy_precision(recorded: str, device: torch.device) -> str:
    """``recorded`` as a resolved value (``auto`` was bf16 on CUDA, fp32 elsewhere)."""
    if recorded != "auto":
        return recorded
    return "bf16" if device.type == "cuda" else "fp32"


def recorded_precision(run_dir: Path, device: torch.device) -> str | None:
    """The precision a run folder's ``config.json`` recorded (``None``: no readable config yet)."""
    try:
        saved = json.loads((run_dir / "config.json").read_text())["train"]["precision"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return legacy_precision(saved, device) if saved in ("auto", "fp32", "bf16") else None


def run_gemms(cfg: RunConfig, micro_batch: int) -> list[tuple[int, int, int]]:
    """The GEMMs of one micro-batch's training step of the run's text trunk (with its table), from the meta model."""
    model = build_model(cfg.model, cfg.ple, device="meta", ac=cfg.aux)
    return step_gemms(forward_gemms(model, micro_batch * cfg.train.seq_len))


def run_precision(cfg: RunConfig, device: torch.device, micro_batch: int, run_dir: Path | None,
                  resume: bool) -> PrecisionChoice:
    """How the run trains: ``auto`` on a resumed run keeps what its folder recorded; otherwise resolved here."""
    requested = cfg.train.precision
    if resume and run_dir is not None and requested == "auto":
        recorded = recorded_precision(run_dir, device)
        if recorded is not None:
            return PrecisionChoice(requested, recorded, "recorded by the run (resumed: not probed again)")
    if requested != "auto" or device.type != "cpu":
        return resolve_precision(requested, device)
    return resolve_precision(requested, device, run_gemms(cfg, micro_batch))


def eval_precision(cfg: RunConfig, device: torch.device) -> str:
    """The precision a trained run is evaluated in on ``device``: the one it recorded, except bf16 on a CPU without
    bf16 units, where bf16 is emulated (≈ 8× slower): fp32 there."""
    recorded = legacy_precision(cfg.train.precision, device)
    if recorded == "bf16" and device.type == "cpu" and not cpu_bf16_flags():
        return "fp32"
    return recorded


def with_precision(cfg: RunConfig, resolved: str) -> RunConfig:
    """``cfg`` with ``train.precision`` set to the resolved value (what ``config.json`` records)."""
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, precision=resolved))
