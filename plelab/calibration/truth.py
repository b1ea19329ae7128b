"""What is true of a configuration, read from finished runs of seeds the call did not see.

- USED: the final models rely on the table. Pooled over the held-out seeds' final use tests (each Δ_permute with
  its standard error over validation windows): USED when the mean Δ ≥ DELTA_USE and its lower 2-se bound > 0;
  not USED when its upper 2-se bound < DELTA_USE; otherwise undecided by the runs (``None``, counted).
  DELTA_USE is a declared smallest effect of interest (a fifth of the seed's dP=256 gain), not a fitted number.
- BENEFIT: the table helps the final loss against both the zero-table and the i.i.d.-id arm (same seed, same
  data order, same trunk init). Seeds are the blocks: a paired t interval per reference
  (:func:`plelab.sweeps.stats.paired`) on the held-out seeds' final losses (mean of the last 3 evaluations).
  BENEFIT when both 95% intervals lie below 0; no BENEFIT when either reference is equivalent within ±DELTA_BENEFIT
  (TOST at α) or significantly better; otherwise undecided (``None``).
"""

from __future__ import annotations

import math

import numpy as np

from plelab.sweeps.stats import paired

DELTA_USE = 0.005  # nats: the smallest reliance worth calling USED
DELTA_BENEFIT = 0.01  # nats: the smallest final-loss gain worth calling BENEFIT at CPU scale
ALPHA = 0.05


def used_truth(finals: list[tuple[float, float]]) -> tuple[bool | None, str]:
    """``finals``: (Δ_permute, se) of each held-out seed's final checkpoint."""
    if not finals:
        return None, "no held-out seed"
    mean = float(np.mean([d for d, _ in finals]))
    se = math.sqrt(sum(s * s for _, s in finals)) / len(finals)
    what = f"held-out final Δ_permute {mean:+.4f}±{se:.4f} over {len(finals)} seeds"
    if mean >= DELTA_USE and mean - 2 * se > 0:
        return True, what
    if mean + 2 * se < DELTA_USE:
        return False, what
    return None, what + ": neither"


def benefit_truth(arm: list[float], refs: dict[str, list[float]]) -> tuple[bool | None, str]:
    """``arm``: held-out seeds' final losses; ``refs``: the same seeds' final losses of each reference arm."""
    if len(arm) < 2:
        return None, f"{len(arm)} held-out seed(s): no test"
    parts, better, not_better = [], [], []
    for name, ref in refs.items():
        c = paired(name, "arm", np.asarray(arm) - np.asarray(ref), DELTA_BENEFIT, ALPHA)
        parts.append(f"vs {name} {c.mean:+.4f} [{c.ci_low:+.4f}, {c.ci_high:+.4f}]")
        better.append(c.ci_high < 0)
        not_better.append(c.p_tost < ALPHA or c.ci_low > 0 or (c.se == 0 and c.mean == 0))
    what = f"held-out final Δ {', '.join(parts)} over {len(arm)} seeds"
    if all(better):
        return True, what
    if any(not_better):
        return False, what
    return None, what + ": neither"
