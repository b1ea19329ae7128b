"""The order in which a visual run (and an online quantizer, on its own stream) sees the training scenes."""

from __future__ import annotations

import torch

from plelab.runtime import EpochOrder


class SceneSampler:
    """A fresh permutation of the training scenes every epoch, from the run seed (one cached at a time)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed
        self._permutation = EpochOrder(n, seed, lambda e: f"e{e}")

    def batch(self, step: int, batch_size: int, rows: slice = slice(None)) -> torch.Tensor:
        positions = range(step * batch_size, (step + 1) * batch_size)[rows]
        return torch.tensor([int(self._permutation(pos // self.n)[pos % self.n]) for pos in positions],
                            dtype=torch.long)

    def epochs(self, step: int, batch_size: int) -> float:
        return step * batch_size / self.n
