"""Row-sparse updates of the per-layer table (``train.table_optimizer=row-sparse``).

A step looks up only the rows of the batch's tokens, yet dense AdamW reads and writes all
``Vp × L·dP`` entries of the table, its gradient and both moments. Here the table is an
``nn.Embedding(sparse=True)``: its gradient is a sparse COO tensor holding only the rows looked
up, and :class:`RowSparseAdamW` updates exactly those rows.

Semantics versus dense AdamW (``torch.optim.AdamW``, decoupled decay), per table row ``r``:

- a row present in the step's gradient gets the AdamW update with the same arithmetic
  (``m ← lerp(m, g, 1−β1)``, ``v ← β2 v + (1−β2) g²``, ``w ← w(1 − lr·wd) − lr/(1−β1^t) · m /
  (√v/√(1−β2^t) + ε)``), ``t`` the number of steps the optimizer has taken (one counter per
  table, as in ``torch.optim.SparseAdam``);
- a row absent from the gradient is left untouched: its moments do not decay and it gets
  neither momentum nor weight decay ("lazy" Adam). Dense AdamW would still move it by
  ``lr·m̂/(√v̂+ε)`` from its past moments and decay it.

So the two are identical on rows touched every step (tested), and differ only on rows skipped
in some steps, where the lazy update is the one recommenders use (TorchRec, ``SparseAdam``).
With ``train.table_weight_decay > 0`` the diagnostics' ``α = Π(1 − lr·wd)`` is exact only for
rows touched every step. Memory: the dense ``[Vp, L·dP]`` gradient is never built (the
moments stay dense: same indices as the table, same checkpoint format as AdamW).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist

from plelab.errors import PlelabError


class RowSparseAdamW(torch.optim.AdamW):
    """AdamW whose groups with ``row_sparse=True`` take sparse row gradients (see the module doc).

    Other groups are stepped by ``torch.optim.AdamW`` itself, unchanged. The state of a sparse
    parameter uses AdamW's keys (``step``, ``exp_avg``, ``exp_avg_sq``), so checkpoints and
    ``get_optimizer_state_dict`` treat both alike.
    """

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D102 — as torch.optim.AdamW.step
        if closure is not None:
            raise ValueError("RowSparseAdamW.step takes no closure")
        sparse = [p for g in self.param_groups if g.get("row_sparse") for p in g["params"] if p.grad is not None]
        held = [p.grad for p in sparse]
        for p in sparse:  # AdamW refuses sparse gradients: hide them while it steps the dense groups
            p.grad = None
        try:
            super().step()
        finally:
            for p, g in zip(sparse, held):
                p.grad = g
        for group in self.param_groups:
            if group.get("row_sparse"):
                for p in group["params"]:
                    if p.grad is not None:
                        self._row_step(p, group)

    def _row_step(self, p: torch.Tensor, group: dict) -> None:
        # A dense gradient (torch.distributed.checkpoint initialises optimizer state with zero grads)
        # counts as the rows where it is non-zero.
        grad = p.grad.coalesce() if p.grad.is_sparse else p.grad.to_sparse(sparse_dim=1)
        rows, vals = grad.indices()[0], grad.values()
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["step"] += 1
        t = state["step"].item()
        lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
        beta1, beta2 = group["betas"]
        w = p.index_select(0, rows)
        m = state["exp_avg"].index_select(0, rows)
        v = state["exp_avg_sq"].index_select(0, rows)
        if wd != 0:
            w.mul_(1 - lr * wd)
        m.lerp_(vals, 1 - beta1)
        v.mul_(beta2).addcmul_(vals, vals, value=1 - beta2)
        step_size = lr / (1 - beta1 ** t)
        denom = (v.sqrt() / (1 - beta2 ** t) ** 0.5).add_(eps)
        w.addcdiv_(m, denom, value=-step_size)
        p.index_copy_(0, rows, w)
        state["exp_avg"].index_copy_(0, rows, m)
        state["exp_avg_sq"].index_copy_(0, rows, v)


def coalesce_sparse_grads(params: Iterable[torch.Tensor]) -> None:
    """Sum duplicate rows of every sparse gradient in place (autograd concatenates them)."""
    for p in params:
        if p.grad is not None and p.grad.is_sparse:
            p.grad = p.grad.coalesce()


def grad_norm(params: list[torch.Tensor]) -> torch.Tensor:
    """Total L2 norm of the gradients, dense ones and coalesced sparse ones (``sqrt(‖dense‖² + Σ‖values‖²)``).

    Without sparse gradients it is ``torch.nn.utils.get_total_norm`` — what ``clip_grad_norm_`` computes first,
    so that norm-then-:func:`clip_with_norm` is bit-identical to ``clip_grad_norm_``.
    """
    grads = [p.grad for p in params if p.grad is not None]
    sparse = [g for g in grads if g.is_sparse]
    dense = [g for g in grads if not g.is_sparse]
    if not sparse:
        return torch.nn.utils.get_total_norm(dense)
    sq = [torch.linalg.vector_norm(g.values()).pow(2) for g in sparse]
    if dense:
        sq.append(torch.nn.utils.get_total_norm(dense).pow(2).to(sq[0].device))
    return torch.stack(sq).sum().sqrt()


def clip_with_norm(params: list[torch.Tensor], max_norm: float, total: torch.Tensor) -> None:
    """Scale every gradient by ``min(1, max_norm / (total + 1e-6))`` (``total`` from :func:`grad_norm`)."""
    dense = [p for p in params if p.grad is not None and not p.grad.is_sparse]
    if dense:
        torch.nn.utils.clip_grads_with_norm_(dense, max_norm, total)
    sparse = [p.grad for p in params if p.grad is not None and p.grad.is_sparse]
    if sparse:
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in sparse:
            g.values().mul_(coef.to(g.device))


def all_reduce_sparse_grad(p: torch.Tensor, world_size: int, comm_device: torch.device) -> None:
    """Average a sparse row gradient over ranks (DDP's mean), by all-gathering rows and values.

    NCCL has no sparse all-reduce, so every rank pads its ``(rows, values)`` to the largest count,
    all-gathers them on ``comm_device`` and sums duplicates. The result is coalesced on every rank.
    """
    g = p.grad.coalesce()
    rows, vals = g.indices()[0], g.values()
    n = torch.tensor([rows.numel()], device=comm_device)
    counts = [torch.zeros_like(n) for _ in range(world_size)]
    dist.all_gather(counts, n)
    most = int(max(c.item() for c in counts))
    pad_rows = torch.zeros(most, dtype=rows.dtype, device=comm_device)
    pad_vals = torch.zeros(most, vals.shape[1], dtype=vals.dtype, device=comm_device)
    pad_rows[:rows.numel()] = rows.to(comm_device)
    pad_vals[:rows.numel()] = vals.to(comm_device)
    all_rows = [torch.empty_like(pad_rows) for _ in range(world_size)]
    all_vals = [torch.empty_like(pad_vals) for _ in range(world_size)]
    dist.all_gather(all_rows, pad_rows)
    dist.all_gather(all_vals, pad_vals)
    keep_rows = torch.cat([r[:int(c.item())] for r, c in zip(all_rows, counts)]).to(p.device)
    keep_vals = torch.cat([v[:int(c.item())] for v, c in zip(all_vals, counts)]).to(p.device)
    summed = torch.sparse_coo_tensor(keep_rows.unsqueeze(0), keep_vals, p.shape).coalesce()
    p.grad = summed / world_size



def table_is_sparse(cfg, distributed: bool) -> bool:
    """Whether the run's per-layer table gets sparse row gradients (``train.table_optimizer=row-sparse``, a learned
    table only; the model is built so). Refuses a dense host-side table under torchrun."""
    tc, pc = cfg.train, cfg.ple
    learned = pc.enabled and pc.table == "learned"
    if distributed and tc.table_device == "cpu" and tc.table_optimizer != "row-sparse" and learned:
        raise PlelabError("train.table_device=cpu under torchrun needs train.table_optimizer=row-sparse (a dense "
                          "host-side gradient cannot be all-reduced by NCCL); add --set "
                          "train.table_optimizer=row-sparse")
    return tc.table_optimizer == "row-sparse" and learned
