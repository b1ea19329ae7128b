"""The rungs a study adds for its scaling fit: more trunk widths × more run lengths, each its own sweep.

A single-size dP study cannot identify ``L(N, D)``; :func:`plelab.scaling.scaling_runs.fit_runs` needs ≥ 4 sizes ×
≥ 3 token budgets, each budget its own run (an evaluation inside one cosine run mixes the schedule's position with
the tokens seen). A :class:`FitLadder` names them: every ``hidden × steps`` cell except the study's own is a
small dP sweep (the baseline and one PLE arm at dP/H = ``ratio``, ``seeds`` seeds) in ``ROOT/ladder/H{h}-s{steps}``,
with the FFN ratio, heads and everything else of the study's preset held. The fit then reads every finished run
under ``ROOT`` — the study's arms enter at its own size and length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from plelab.config import resolve_config
from plelab.errors import ConfigError
from plelab.sweeps.commands import dp_spec
from plelab.sweeps.spec import SweepSpec, load_spec, merge_spec


@dataclass(frozen=True)
class FitLadder:
    hidden: tuple[int, ...]  # trunk widths H (the study's own among them)
    steps: tuple[int, ...]  # run lengths (the study's own among them); batch and sequence held
    ratio: float  # dP/H of the PLE arm at every rung
    seeds: int = 2  # the bootstrap resamples seeds as blocks: at least 2


def ladder_specs(ladder: FitLadder, root: str | Path, preset: str, overrides: Sequence[str],
                 own: tuple[int, int]) -> list[tuple[Path, SweepSpec]]:
    """``[(folder, spec), …]`` of every rung but ``own`` (the study's ``(hidden, steps)``), grown into or checked
    against what each folder already holds. A width whose ``ratio · H`` is not a whole dP is refused."""
    if ladder.seeds < 2:
        raise ConfigError(f"a fit ladder needs at least 2 seeds (the bootstrap resamples seeds), got {ladder.seeds}")
    if own[0] not in ladder.hidden or own[1] not in ladder.steps:
        raise ConfigError(f"fit ladder: the study's own H = {own[0]}, {own[1]} steps is not one of its cells "
                          f"(H {ladder.hidden} × steps {ladder.steps}); include it, so the study's runs are a rung")
    base = resolve_config(preset, overrides)
    ffn = base.model.intermediate_size / base.model.hidden_size
    plans = []
    for h in ladder.hidden:
        dp = round(ladder.ratio * h)
        if abs(dp - ladder.ratio * h) > 1e-9 or dp < 1:
            raise ConfigError(f"fit ladder: dP/H = {ladder.ratio:g} at H = {h} is dP {ladder.ratio * h:g}, not a whole "
                              "number; choose widths where it is")
        for steps in ladder.steps:
            if (h, steps) == tuple(own):
                continue
            folder = Path(root) / "ladder" / f"H{h}-s{steps}"
            sets = [*overrides, f"model.hidden_size={h}", f"model.intermediate_size={round(ffn * h)}"]
            spec = dp_spec(preset=preset, overrides=sets, dp=[0, dp], seeds=ladder.seeds, steps=steps,
                           existing=load_spec(folder))
            plans.append((folder, merge_spec(folder, spec)))
    return plans
