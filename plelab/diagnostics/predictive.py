"""How much does an ID space tell about the next target beyond what the model already has?

The seeds explain text PLE's success and visual PLE's failure by a "self-supervised loop":
text ids are also prediction targets, visual ids are not. Rows of a text table, however, get
gradient only through the input side too; what can differ between ID spaces is how much the
id says about the targets *given the continuous features*. This module measures that.

Probe: freeze the model; take its final hidden states h and its logits ``head(h)``. Fit a
low-rank per-id logit offset ``offset(id) = A[id] · B`` (A: K×r, B: r×V, B starts at 0) on
training windows by minimising ``CE(head(h) + offset(id), y)``; report the validation CE gain
(nats/token). Up to estimation error it is a lower bound of the conditional information
I(Y; ID | h) that a linear read-out can use. Beside it: the mean gradient norm per used table
row on a training batch, and whether the ID space is itself a prediction target.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from plelab.model.ple import IIDTableIds, PLEModules
from plelab.model.transformer import PLECausalLM


@torch.no_grad()
def _features(model: PLECausalLM, windows: torch.Tensor, batch: int, seed: int, iid: IIDTableIds | None):
    tm = model.model
    hs, ids, ys = [], [], []
    for i in range(0, len(windows), batch):
        inputs = windows[i:i + batch, :-1]
        table_ids = (tm.table_ids(inputs) if iid is None
                     else iid.draw(inputs, torch.Generator(device=iid.probs.device).manual_seed(seed + i)))
        hs.append(tm(inputs, table_ids=table_ids).reshape(-1, model.mc.hidden_size))
        ids.append(table_ids.reshape(-1))
        ys.append(windows[i:i + batch, 1:].reshape(-1))
    return torch.cat(hs), torch.cat(ids), torch.cat(ys)


def _ce(model: PLECausalLM, h, ids, y, a=None, b=None, chunk: int = 4096) -> torch.Tensor:
    total = torch.zeros(())
    w = model.output_weight().detach()
    for i in range(0, len(h), chunk):
        logits = F.linear(h[i:i + chunk], w)
        if a is not None:
            logits = logits + a[ids[i:i + chunk]] @ b
        total = total + F.cross_entropy(logits.float(), y[i:i + chunk], reduction="sum")
    return total / len(h)


def mean_row_gradient(model: PLECausalLM, window: torch.Tensor, iid: IIDTableIds | None = None) -> float:
    """Mean gradient norm per table row looked up in one training batch (``[B, T+1]`` tokens; ``iid``: the null
    control's ids, drawn from the global generator).

    A frozen table (``ple.table=frozen``) is measured too: the gradient that would reach it."""
    table = PLEModules(model).table
    frozen = not table.requires_grad
    table.requires_grad_(True)
    model.zero_grad(set_to_none=True)
    inputs = window[:, :-1]
    model(inputs, targets=window[:, 1:], table_ids=None if iid is None else iid.draw(inputs)).loss.backward()
    norms = table.grad.norm(dim=1)
    table.requires_grad_(not frozen)
    used = norms > 0
    value = float(norms[used].mean()) if used.any() else 0.0
    model.zero_grad(set_to_none=True)
    return value


def id_information(model: PLECausalLM, train_windows: torch.Tensor, val_windows: torch.Tensor, rank: int = 8,
                   steps: int = 300, lr: float = 1e-2, batch: int = 16, seed: int = 0,
                   iid: IIDTableIds | None = None) -> dict:
    """Validation CE gain (nats/token) of per-id logit offsets on top of the frozen model.

    The probe is fitted on 80% of the training windows' tokens and early-stopped on the other
    20% (checked every 10 steps), so that a few thousand tokens do not simply get memorised. ``iid``: the
    null control's id frequencies (``ple.ids='iid'``), drawn seeded per chunk.
    """
    was = model.training
    model.eval()
    h_all, id_all, y_all = _features(model, train_windows, batch, seed, iid)
    h_va, id_va, y_va = _features(model, val_windows, batch, seed + 7_919, iid)
    cut = int(0.8 * len(h_all))
    h_tr, id_tr, y_tr = h_all[:cut], id_all[:cut], y_all[:cut]
    h_ho, id_ho, y_ho = h_all[cut:], id_all[cut:], y_all[cut:]
    K, V = PLEModules(model).table.shape[0], model.mc.vocab_size
    gen = torch.Generator().manual_seed(seed)
    a = (torch.randn(K, rank, generator=gen) * 0.1).requires_grad_()
    b = torch.zeros(rank, V, requires_grad=True)
    opt = torch.optim.Adam([a, b], lr=lr)
    with torch.no_grad():
        best = (float(_ce(model, h_ho, id_ho, y_ho, a, b)), a.detach().clone(), b.detach().clone(), 0)
    for step in range(1, steps + 1):
        idx = torch.randint(0, len(h_tr), (min(4096, len(h_tr)),), generator=gen)
        loss = _ce(model, h_tr[idx], id_tr[idx], y_tr[idx], a, b)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0:
            with torch.no_grad():
                held = float(_ce(model, h_ho, id_ho, y_ho, a, b))
            if held < best[0]:
                best = (held, a.detach().clone(), b.detach().clone(), step)
    _, a, b, best_step = best
    with torch.no_grad():
        base_va, probe_va = _ce(model, h_va, id_va, y_va), _ce(model, h_va, id_va, y_va, a, b)
        base_tr, probe_tr = _ce(model, h_tr, id_tr, y_tr), _ce(model, h_tr, id_tr, y_tr, a, b)
    model.train(was)
    return {"val_gain_nats": float(base_va - probe_va), "train_gain_nats": float(base_tr - probe_tr),
            "val_base_ce": float(base_va), "tokens_fit": len(h_tr), "tokens_val": len(h_va), "rank": rank,
            "probe_steps": best_step,
            "mean_row_grad_norm": mean_row_gradient(model, train_windows[:batch], iid),
            "is_prediction_target": model.pc.ids == "token",
            "id_space": "text tokens (also the LM's targets)" if model.pc.ids == "token"
            else "i.i.d. null ids (never a target)"}
