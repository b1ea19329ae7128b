"""Losses of a causal LM: the training loss through the LM head in row chunks, and per-window evaluation losses
over fixed windows (the trainer's validation, eval, the use test)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from plelab.errors import PlelabError
from plelab.model.ple import IIDTableIds

CHUNKED_LOSS = hasattr(F, "linear_cross_entropy")  # torch's fused head + CE; older torch computes it unchunked
LOSS_CHUNK_ROWS = 512  # rows of [N, V] logits per chunk (measured: 256–1024 tie, BENCHMARKS.md "Chunked loss")


def head_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                       reduction: str = "mean") -> torch.Tensor:
    """Next-token CE of ``hidden [..., H]`` through the LM head ``weight [V, H]`` against ``targets [...]``
    (-100 ignored), in fp32: the mean, or with ``reduction="none"`` one value per position ``[N]`` (``N`` = the
    positions of ``targets``, flattened).

    Without autocast: ``torch.nn.functional.linear_cross_entropy`` in chunks of ``LOSS_CHUNK_ROWS`` rows, its
    gradients made chunk by chunk in the forward, so the ``[N, V]`` logits and their gradient never exist
    whole; equal to ``cross_entropy(linear(hidden, weight), targets)`` up to float summation order. Under autocast
    the head runs in the autocast dtype and the CE on fp32 logits, unchunked: the chunked op returns its loss in
    the inputs' dtype (a bf16 loss is rounded to ≈ 0.03 nats). A torch without the op computes it unchunked."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device) or not CHUNKED_LOSS:
        logits = F.linear(hidden, weight).float()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100,
                               reduction=reduction)
    options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=LOSS_CHUNK_ROWS, chunking_method=None,
                                                 acc_policy="compact")
    return F.linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), weight, targets.reshape(-1),
                                  ignore_index=-100, reduction=reduction, options=options)


def output_logits(out) -> torch.Tensor:
    """The logits ``[B,T,V]`` in a causal LM's forward output: its ``.logits`` (HF, plelab) or the output itself
    when it is a tensor; any other output (a tuple such as nanoGPT's ``(logits, loss)``) needs a ``logits_of``."""
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "logits"):
        return out.logits
    raise PlelabError(f"the model's forward returned a {type(out).__name__}, which holds no .logits: pass "
                      "logits_of=, a function from the forward's output to its logits [B,T,V] (e.g. "
                      "logits_of=lambda out: out[0] for a (logits, loss) tuple)")


@torch.no_grad()
def window_losses(model: nn.Module, windows: torch.Tensor, batch: int, device: torch.device,
                  iid: IIDTableIds | None = None, logits_of: Callable | None = None) -> torch.Tensor:
    """Per-window mean next-token CE ``[N]`` of ``windows [N, T+1]``, ``batch`` windows per forward.

    ``iid``: the null control's id frequencies (``ple.ids='iid'``); its draws are seeded per chunk, so two
    evaluations of the same windows are paired. A plelab LM (one with ``output_weight()``) is scored through its
    chunked head (``return_logits=False, loss_reduction="none"``: no ``[b, T, V]`` logits); any other causal LM
    through its logits, read from ``model(inputs)`` by ``logits_of`` (default :func:`output_logits`).
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
        kw = {} if ids is None else {"table_ids": ids}
        if hasattr(model, "output_weight"):  # through forward, so that FSDP2's and users' hooks run
            ce = model(inputs, targets=chunk[:, 1:], return_logits=False, loss_reduction="none", **kw).loss
        else:
            logits = (output_logits if logits_of is None else logits_of)(model(inputs, **kw))
            if not isinstance(logits, torch.Tensor) or logits.ndim != 3 or logits.shape[:2] != inputs.shape:
                got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
                raise PlelabError(f"the model's logits for {tuple(inputs.shape)} input ids are {got}; the use test "
                                  "needs [B,T,V], one row per position (not only the last): make logits_of return them")
            logits = logits.float()
            ce = F.cross_entropy(logits.transpose(1, 2), chunk[:, 1:], reduction="none")
        out.append(ce.mean(1).cpu())
    model.train(was)
    return torch.cat(out).double()
