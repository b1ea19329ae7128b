"""The suite's tiny dP sweep (``cpu-tiny``, 30 steps): its definition, shared by the tests that run or read it."""

from __future__ import annotations

from plelab.sweeps.spec import SweepSpec, dp_arms

TINY = ["train.eval_every=10", "train.early_checkpoint=10", "train.diag_every=5", "train.checkpoint_every=0",
        "train.diag_windows=16"]


def tiny_spec(**kw) -> SweepSpec:
    """dP 0 / 8 / 16 with the matched, frozen and zero controls, seeds 0 and 1; ``kw`` replaces any field."""
    args = dict(preset="cpu-tiny", overrides=list(TINY), arms=dp_arms([0, 8, 16], ["matched", "frozen", "zero"]),
                seeds=[0, 1], steps=30)
    args.update(kw)
    return SweepSpec(**args)
