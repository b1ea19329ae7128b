"""Signal metrics from a live model, per layer: how strong is the injection, and what reaches it?

Collected during a normal forward/backward through forward hooks on the PLE modules (no second
forward of the model), so the trainer can log them every ``train.diag_every`` steps cheaply:

- ``snr``: RMS of the PLE branch output / RMS of the hidden state it is added to;
- ``table_to_proj``: RMS of the table part z / RMS of the model-projection part c of the
  per-layer input (before ``(c + z)·2^-½``);
- ``branch_erank``: effective rank of the injected vectors across ≤ 1,024 tokens;
- ``gate``: mean |gelu(W_g h)| (gemma) or mean |g| (scalar / vector); absent for none.
  In the Gemma form the gate is not the signal strength: ``post_per_layer_input_norm``
  rescales the branch whatever the gate does — read ``snr`` for strength;
- gradient norms reaching each layer's table slice, gate and projection, and that layer's
  trunk (attention + MLP) for scale.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from plelab.diagnostics.structure import effective_rank
from plelab.model.ple import PLEModules

_MAX_TOKENS = 1024
TRUNK_BLOCKS = ("self_attn", "attention", "attn", "mlp")  # attention and MLP (GPT-NeoX: attention; nanoGPT: attn)


def _rms(x: torch.Tensor) -> float:
    return float(x.detach().float().pow(2).mean().sqrt())


def _full(t: torch.Tensor | None) -> torch.Tensor | None:
    return t.full_tensor() if t is not None and hasattr(t, "full_tensor") else t


def row_gradient(weight: torch.Tensor) -> torch.Tensor | None:
    """A table's gradient on the rows that may have one: ``[rows, D]`` (dense: all rows; sparse, from
    ``train.table_optimizer=row-sparse``: the rows present). Sums of squares over it equal those of the
    full gradient. None when there is none."""
    g = weight.grad
    if g is None:
        return None
    return g.coalesce().values() if g.is_sparse else g


def _sq_sum(t: torch.Tensor, cols: slice = slice(None)) -> torch.Tensor:
    """Sum of squares of ``t[:, cols]`` (or all of ``t``) without gathering a sharded tensor:
    for an FSDP2 DTensor (rows sharded) each rank sums its shard and one all-reduce adds them."""
    if hasattr(t, "to_local"):
        local = t.to_local().detach().float()
        part = (local[:, cols] if local.ndim == 2 else local).pow(2).sum()
        if any(p.is_shard() for p in t.placements):
            dist.all_reduce(part)
        return part
    t = t.detach().float()
    return (t[:, cols] if t.ndim == 2 and cols != slice(None) else t).pow(2).sum()


def _norm(t: torch.Tensor | None) -> float | None:
    return None if t is None else float(_sq_sum(t).sqrt())


def table_gradient_norm(weight: torch.Tensor) -> float | None:
    """‖∂L/∂W‖ of a table ``[rows, D]`` (dense or row-sparse; sharded: summed over ranks), None without a gradient."""
    return _norm(row_gradient(weight))


class SignalProbe:
    """Context manager: attach to a PLE model, run forward (+ backward), read ``summary()``.

    It observes through forward hooks on the model's :class:`~plelab.model.ple.PerLayerEmbedding` (``c`` and ``z``
    recomputed from the hook's inputs, exactly as the forward computes them) and on each layer's
    :class:`~plelab.model.ple.PerLayerInjection` (``h``, ``p`` -> branch); the hooks are removed on exit.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model, self.ple = model, PLEModules(model)
        L = self.ple.num_layers
        self.stats: dict[str, list] = {k: [None] * L for k in ("snr", "branch_erank", "gate", "table_to_proj")}
        self._handles: list = []

    def _layer_hook(self, index: int):
        def hook(injection, args, branch) -> None:
            h, _ = args
            o = injection.owner
            with torch.no_grad():
                self.stats["snr"][index] = _rms(branch) / max(_rms(h), 1e-30)
                rows = branch.detach().reshape(-1, branch.shape[-1])[:_MAX_TOKENS].float()
                self.stats["branch_erank"][index] = effective_rank(torch.linalg.svdvals(rows).pow(2))
                if injection.gate == "gemma":
                    self.stats["gate"][index] = float(F.gelu(o.per_layer_input_gate(h), approximate="tanh")
                                                      .abs().mean())
                elif injection.gate in ("scalar", "vector"):
                    self.stats["gate"][index] = float(_full(o.per_layer_gate).detach().abs().mean())
        return hook

    def _input_hook(self, embedding, args, _out) -> None:
        inputs_embeds, table_ids, token_part = (*args, None, None)[:3]
        with torch.no_grad():
            c = embedding.projection_part(inputs_embeds)
            z = embedding.token_part(table_ids) if token_part is None else token_part
            zr = z.detach().float().pow(2).mean(dim=(0, 1, 3)).sqrt()
            cr = c.detach().float().pow(2).mean(dim=(0, 1, 3)).sqrt().clamp_min(1e-30)
            self.stats["table_to_proj"] = (zr / cr).tolist()

    def __enter__(self) -> SignalProbe:
        self._handles = [self.ple.embedding.register_forward_hook(self._input_hook)]
        self._handles += [injection.register_forward_hook(self._layer_hook(i))
                          for i, injection in enumerate(self.ple.injections)]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def summary(self) -> dict[str, list]:
        return dict(self.stats)


def gradient_norms(model: nn.Module) -> dict[str, list]:
    """Per-layer gradient norms after a backward: table slice, gate, projection and trunk (the attention and MLP of
    the decoder layer holding the injection, ``PLEModules.layers``; its other non-PLE parameters where it names
    neither; None when the holder has no other parameters, e.g. a list of injections)."""
    ple = PLEModules(model)
    dP = ple.dim
    table_grad = row_gradient(ple.table)  # dense, or the rows of a sparse gradient
    own = {id(p) for p in ple.parameters()}
    out: dict[str, list] = {"grad_table": [], "grad_gate": [], "grad_proj": [], "grad_trunk": []}
    for i, (injection, holder) in enumerate(zip(ple.injections, ple.layers)):
        layer = injection.owner
        out["grad_table"].append(None if table_grad is None else
                                 float(_sq_sum(table_grad, slice(i * dP, (i + 1) * dP)).sqrt()))
        gate = (layer.per_layer_input_gate.weight if injection.gate == "gemma"
                else getattr(layer, "per_layer_gate", None))
        out["grad_gate"].append(None if gate is None else _norm(gate.grad))
        out["grad_proj"].append(_norm(layer.per_layer_projection.weight.grad))
        blocks = [getattr(holder, n) for n in TRUNK_BLOCKS if isinstance(getattr(holder, n, None), nn.Module)]
        params = [p for b in blocks for p in b.parameters()] or [p for p in holder.parameters() if id(p) not in own]
        trunk = [_sq_sum(p.grad) for p in params if p.grad is not None]
        out["grad_trunk"].append(float(torch.stack(trunk).sum().sqrt()) if trunk else None)
    return out
