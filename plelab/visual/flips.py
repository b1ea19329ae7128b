"""The ID-flip meter (``visual_tokenizers_and_diagnostics.md`` §4.5): how often a fixed probe set of
patches changes ID between two points of training, against chance, and why.

- flip rate ``F(t, t+Δ) = (1/M) Σ_m 1[id_t(m) ≠ id_{t+Δ}(m)]``;
- chance ``1 − Σ_k p_k(t)·p_k(t+Δ)``: the flip rate of independent draws from the two marginals;
- restart flips: flips whose old or new ID was re-initialised by a dead-code restart in the interval
  (the ID kept its integer but changed its meaning); every other flip is a boundary flip;
- binary quantizers (LFQ, BSQ): the flip rate of every bit, the mean Hamming distance between old
  and new IDs, and the median margin ``|z_i|`` (bits near the sign boundary flip).

A frozen or offline tokenizer must measure exactly 0.
"""

from __future__ import annotations

import torch

from plelab.visual.quantizers import OnlineQuantizer, ids_to_bits


def flip_stats(old: torch.Tensor, new: torch.Tensor, k: int, restarted: set[int] | None = None,
               bits: int | None = None) -> dict:
    """Flips between two aligned ID vectors ``[M]``; ``restarted`` codes, ``bits`` for binary codes."""
    old, new = old.reshape(-1).long(), new.reshape(-1).long()
    flips = old != new
    p = torch.bincount(old, minlength=k).double() / len(old)
    q = torch.bincount(new, minlength=k).double() / len(new)
    out = {"patches": len(old), "flip_rate": float(flips.double().mean()), "chance": float(1 - p @ q)}
    codes = torch.tensor(sorted(restarted or ()), dtype=torch.long)
    by_restart = flips & (torch.isin(old, codes) | torch.isin(new, codes)) if len(codes) else torch.zeros_like(flips)
    out["restart_flip_rate"] = float(by_restart.double().mean())
    out["boundary_flip_rate"] = float((flips & ~by_restart).double().mean())
    if bits is not None:
        changed = ids_to_bits(old, bits) != ids_to_bits(new, bits)  # [M, bits]
        out["bit_flip_rate"] = changed.double().mean(0).tolist()
        out["mean_hamming"] = float(changed.sum(1).double().mean())
    return out


class FlipMeter:
    """Feed it the quantizer at chosen steps; it compares each probe assignment with the previous one."""

    def __init__(self, probe: torch.Tensor, k: int) -> None:
        self.probe, self.k = probe, k
        self.last: torch.Tensor | None = None
        self.last_step = 0
        self.rows: list[dict] = []

    def record(self, step: int, quantizer: OnlineQuantizer) -> dict | None:
        ids = quantizer.assign(self.probe)
        row = None
        if self.last is not None:
            restarted = {c for s, codes in getattr(quantizer, "restarts", []) if self.last_step < s <= step
                         for c in codes}
            binary = quantizer.kind in ("lfq", "bsq")
            row = {"step": step, "since": self.last_step,
                   **flip_stats(self.last, ids, self.k, restarted, quantizer.code_dim if binary else None)}
            if binary:
                row["median_margin"] = float(quantizer.margins(self.probe).median())
            self.rows.append(row)
        self.last, self.last_step = ids, step
        return row

    def summary(self) -> dict:
        """Mean flip rate, chance and restart share over the recorded intervals."""
        if not self.rows:
            return {"intervals": 0}
        keys = ("flip_rate", "chance", "restart_flip_rate", "boundary_flip_rate")
        return {"intervals": len(self.rows), **{k: sum(r[k] for r in self.rows) / len(self.rows) for k in keys}}
