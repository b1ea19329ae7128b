"""Where a NaN / Inf came from: the first module whose output is non-finite, and non-finite weights or grads.

When a step's loss or gradient norm is not finite the trainer stops before any update (or, with
``train.skip_nonfinite=N``, skips up to N such steps) and names the culprit in one line: it re-runs the
step's forwards on the step's own batches under ``torch.no_grad`` with a hook on every module and reports
the first module, in execution order, whose output holds a NaN or an Inf, together with any parameter or
gradient that is already non-finite.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from plelab.errors import PlelabError
from plelab.training.checkpoint import list_checkpoints


def _finite(out) -> bool:
    if torch.is_tensor(out):
        return not out.is_floating_point() or bool(torch.isfinite(out).all())
    if isinstance(out, (tuple, list)):
        return all(_finite(o) for o in out)
    if hasattr(out, "__dataclass_fields__"):
        return all(_finite(getattr(out, f)) for f in out.__dataclass_fields__)
    return True


def first_nonfinite_module(model: nn.Module, forward: Callable[[], object]) -> str | None:
    """Name of the first module (execution order) whose forward output is non-finite, or None."""
    found: list[str] = []
    hooks = []
    for name, module in model.named_modules():
        if name:
            def hook(mod, args, out, name=name):
                if not found and not _finite(out):
                    found.append(name)
            hooks.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            forward()
    finally:
        for h in hooks:
            h.remove()
    return found[0] if found else None


def nonfinite_tensors(model: nn.Module, grads: bool = False, limit: int = 3) -> list[str]:
    """Names of parameters (or of their gradients) holding a NaN or an Inf, at most ``limit``."""
    bad = []
    for name, p in model.named_parameters():
        t = p.grad if grads else p
        if t is None:
            continue
        t = t.coalesce().values() if t.is_sparse else t
        if not bool(torch.isfinite(t).all()):
            bad.append(name)
            if len(bad) == limit:
                break
    return bad


def where(name: str) -> str:
    """``model.layers.3.mlp.down_proj`` -> ``model.layers.3.mlp.down_proj (layer 3)``."""
    m = re.search(r"layers\.(\d+)\.", name + ".")
    return f"{name} (layer {m.group(1)})" if m else name


def describe_nonfinite(model: nn.Module, forward: Callable[[], object], loss_finite: bool = False) -> str:
    """One clause naming where a non-finite value came from: the first non-finite module output of
    ``forward()`` (the step's forward again), else — the forward being finite — the backward; then any
    non-finite weights, else gradients (read before any clipping), e.g.
    ``first non-finite output: model.layers.1.mlp.up_proj (layer 1); non-finite weights: …``."""
    culprit = first_nonfinite_module(model, forward)
    if culprit is not None:
        detail = f"first non-finite output: {where(culprit)}"
    elif loss_finite:
        detail = "every forward output is finite: the backward pass produced it"
    else:
        detail = ("every module output on this rank is finite: the loss computation (or another rank's batch) "
                  "produced it")
    weights = nonfinite_tensors(model)
    grads = [] if weights else nonfinite_tensors(model, grads=True)
    if weights:
        detail += f"; non-finite weights: {', '.join(weights)}"
    elif grads:
        detail += f"; non-finite gradients: {', '.join(where(g) for g in grads)}"
    return detail


def stop_message(what: str, step: int, detail: str, run_dir: Path | None) -> str:
    """The one-line error of a run stopped by a non-finite value at (0-based) ``step``."""
    found = list_checkpoints(run_dir) if run_dir is not None else []
    kept = f"its last checkpoint ({found[-1].name}) is kept" if found else "no checkpoint was written yet"
    return (f"{what} at step {step + 1}; {detail}. The run stopped before updating; {kept}. Lower train.lr or "
            "raise train.warmup_steps, check the data, or let up to N such steps be skipped with "
            "--set train.skip_nonfinite=N")


def skip_or_stop(trainer, step: int, batches: list, what: str, loss_finite: bool = False) -> dict:
    """A non-finite loss or gradient norm at ``step`` of ``trainer`` (before any clipping or update): name its origin,
    then skip the step (while ``train.skip_nonfinite`` allows; returns the step's metrics row) or stop with a one-line
    error.

    The origin: every micro-batch of the step again, on every rank (FSDP2 gathers parameters in each forward),
    through the uncompiled module and on the step's own batches (no side effects)."""
    tc = trainer.cfg.train

    def replay() -> None:
        for batch in batches:
            with trainer.env.autocast():
                trainer.task.loss(trainer.wrapped, batch)
    detail = describe_nonfinite(trainer.model, replay, loss_finite=loss_finite)
    trainer.opt.zero_grad(set_to_none=True)
    trainer.task.after_step(step)
    if trainer.skipped_steps < tc.skip_nonfinite:
        trainer.skipped_steps += 1
        trainer.step += 1
        trainer.tokens_seen += trainer.tokens_per_step
        return {"step": trainer.step, "tokens": trainer.tokens_seen, "lr": trainer.opt.param_groups[0]["lr"],
                "skipped": f"{what}; {detail} (skip {trainer.skipped_steps} of train.skip_nonfinite="
                           f"{tc.skip_nonfinite})"}
    raise PlelabError(stop_message(what, step, detail, trainer.run_dir))
