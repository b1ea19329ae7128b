"""A sweep's configs, resolved once and carried as objects.

The base config (preset + the sweep's overrides + its step budget) is resolved once per sweep
(:func:`base_config`, held by the spec); an arm's overrides are parsed once into typed ``(key, value)`` deltas
(:func:`arm_deltas`), and a run's config is the base with the deltas, its seed and the step budget set on a copy
(:func:`run_config`). The override texts stay what ``sweep.json`` and the printed commands hold; a run's config is
the same as resolving preset + every override text afresh (a test holds them equal).
"""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path
from typing import Any

from plelab.config import RunConfig, resolve_config, set_value
from plelab.config.hf_trunk import sync_hf_trunk
from plelab.config.overrides import typed_overrides
from plelab.config.paths import portable
from plelab.precision import PrecisionChoice, study_precision
from plelab.runtime import resolve_device
from plelab.sweeps.spec import Arm, SweepSpec, run_dir
from plelab.training.run_precision import recorded_precision, with_precision


def base_config(spec: SweepSpec) -> RunConfig:
    """A copy of the sweep's base config, resolved once per spec object (again if its preset, overrides or steps
    were changed since, or the working directory, against which relative paths resolve)."""
    key = (spec.preset, tuple(spec.overrides), spec.steps, os.getcwd())
    held = spec.__dict__.get("_base")
    if held is None or held[0] != key:
        held = (key, resolve_config(spec.preset, list(spec.overrides), steps=spec.steps))
        spec.__dict__["_base"] = held
    return copy.deepcopy(held[1])


@functools.lru_cache(maxsize=1024)
def _typed(overrides: tuple[str, ...]) -> tuple[tuple[str, Any], ...]:
    return tuple(typed_overrides(RunConfig(), overrides))


def arm_deltas(arm: Arm) -> list[tuple[str, Any]]:
    """The arm's overrides as typed ``(key, value)`` pairs, in order (parsed once per override list)."""
    return list(_typed(tuple(arm.overrides)))


def run_config(spec: SweepSpec, arm: Arm, seed: int, study: str | None = None) -> RunConfig:
    """The arm's config at ``seed``: the base config with the arm's typed deltas, the seed and the sweep's step
    budget (which wins, as ``steps`` does in :func:`plelab.config.resolve_config`, except over an arm that sets
    ``train.steps`` itself: the baseline's budget ladder, :func:`~plelab.sweeps.spec.budget_arm`).

    An arm that leaves ``train.precision`` at ``auto`` trains in the study's precision ``study`` (resolved once per
    sweep by :func:`sweep_precision`; without it, the study rule, as for a sweep's unstarted runs read by a report);
    an arm's own explicit value is kept."""
    cfg = base_config(spec)
    deltas = arm_deltas(arm)
    for key, value in deltas:
        set_value(cfg, key, value)
    cfg.seed = seed
    if spec.steps is not None and not any(key == "train.steps" for key, _ in deltas):  # a budget arm's own wins
        cfg.train.steps = spec.steps
    cfg = portable(cfg)
    sync_hf_trunk(cfg, {key for key, _ in deltas})
    cfg.validate()
    if cfg.train.precision != "auto":
        return cfg
    if study is None:
        study = study_precision("auto", resolve_device(cfg.train.device)).resolved
    return with_precision(cfg, study)


def _sets_precision(arm: Arm) -> bool:
    return any(key == "train.precision" for key, _ in arm_deltas(arm))


def sweep_precision(root: Path, spec: SweepSpec) -> PrecisionChoice:
    """The study's precision, once per sweep: what its started runs recorded (a resumed or grown sweep keeps it,
    even on another machine), else :func:`plelab.precision.study_precision` on the sweep's base config."""
    base = base_config(spec)
    device = resolve_device(base.train.device)
    if base.train.precision == "auto":
        for seed in spec.seeds:
            for arm in spec.runnable():
                recorded = None if _sets_precision(arm) else recorded_precision(run_dir(root, arm.name, seed), device)
                if recorded is not None:
                    return PrecisionChoice("auto", recorded, "recorded by this sweep's started runs")
    return study_precision(base.train.precision, device)
