"""Evaluation losses of a causal LM over fixed windows (the trainer's validation, eval, the use test)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from plelab.model.ple import IIDTableIds


@torch.no_grad()
def window_losses(model: nn.Module, windows: torch.Tensor, batch: int, device: torch.device,
                  iid: IIDTableIds | None = None) -> torch.Tensor:
    """Per-window mean next-token CE ``[N]`` of ``windows [N, T+1]``, ``batch`` windows per forward.

    ``iid``: the null control's id frequencies (``ple.ids='iid'``); its draws are seeded per chunk, so two
    evaluations of the same windows are paired.
    """
    was = model.training
    model.eval()
    out = []
    for i in range(0, len(windows), batch):
        chunk = windows[i:i + batch].to(device)
        inputs = chunk[:, :-1]
        ids = None
        if iid is not None:
            ids = iid.draw(inputs, torch.Generator(device=iid.probs.device).manual_seed(1_000_003 + i))
        logits = (model(inputs) if ids is None else model(inputs, table_ids=ids)).logits.float()
        ce = F.cross_entropy(logits.transpose(1, 2), chunk[:, 1:], reduction="none")
        out.append(ce.mean(1).cpu())
    model.train(was)
    return torch.cat(out).double()
