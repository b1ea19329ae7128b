"""The PLE mechanism as two modules built from plain numbers, for plelab's model and for yours.

Equations (``docs/ple.md`` §1.2 and §1.4; Gemma 4 ``Gemma4TextModel`` plain form):

    PerLayerEmbedding   e [B,T,H], table ids [B,T]  ->  P [B,T,L,dP]
        z = s · T[ids]                  → [B,T,L,dP]    embed_tokens_per_layer  (s = sqrt(dP), Gemma)
        c = RMSNorm_dP((W_m e) · H^-½)  → [B,T,L,dP]    per_layer_model_projection, per_layer_projection_norm
        P = (c + z) · 2^-½

    PerLayerInjection   h [B,T,H], p = P[:,:,l] [B,T,dP]  ->  branch [B,T,H]   (h ← h + branch)
        gemma:          RMSNorm_H(W_p (gelu_tanh(W_g h) ⊙ p))   per_layer_input_gate, per_layer_projection,
                                                                post_per_layer_input_norm
        scalar/vector:  g ⊙ W_p p                               per_layer_gate (the seed's learned gate)
        none:           W_p p

Tensor names are HF Gemma's. A module built on its own holds its tensors under exactly those names
(``PerLayerEmbedding().state_dict()`` has ``embed_tokens_per_layer.weight``, ...), so a Gemma 4
checkpoint's ``model.*`` / ``model.layers.{l}.*`` entries load into it after stripping that prefix.
With ``register_on=owner`` the tensors are registered on ``owner`` instead — flat, as Gemma keeps them
on its text model and decoder layers — and the module reads them from there at every call: plelab's
own model is built this way, so its ``state_dict`` keys are HF's and every name-keyed rule (seeded
init, optimizer and accounting groups, the DDP ignore list, FSDP units, checkpoints) sees HF names.
The module object is still the one to observe: forward hooks on it see ``(e, ids, token_part) -> P``
and ``(h, p) -> branch``; its ``owner`` attribute is the module that holds its tensors (itself, or ``register_on``).

In your own decoder (the protocol :class:`PLEModules`, :func:`plelab.param_groups` and :class:`plelab.Monitor`
rely on): hold one :class:`PerLayerEmbedding` and one :class:`PerLayerInjection` per layer anywhere in the model,
under any attribute names — they are found by type, no registration call — with the injections registered in
layer order; call the embedding positionally, ``ple(e, ids)``, so the Monitor's hook sees the ids it counts.
Build the injections with ``init="function-preserving"`` for a start equal to the model without PLE.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from plelab.config.schema import GATE_KINDS
from plelab.model.layers import RMSNorm

TABLE_KEY = "model.embed_tokens_per_layer.weight"  # the HF name of a causal LM's per-layer table
INITS = ("function-preserving", "gemma")  # PerLayerInjection's (and plelab.attach's) init
# A standalone injection under init="gemma" warns when, at its first call, its branch's RMS is more than this times
# the RMS of the stream h it is added to: the layer's output is then mostly the (random) branch.
LARGE_BRANCH_RATIO = 1.0


class HostToDevice(torch.autograd.Function):
    """Copy looked-up table rows to the trunk's device (pinned + asynchronous to CUDA); the gradient goes back."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, device: torch.device) -> torch.Tensor:
        ctx.source = rows.device
        if device.type == "cuda" and rows.device.type == "cpu":
            rows = rows.pin_memory()
        return rows.to(device, non_blocking=True)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.to(ctx.source), None


def token_table_ids(input_ids: torch.Tensor, table_rows: int) -> torch.Tensor:
    """The table rows that token ids look up: ``input_ids [B,T]`` -> ``[B,T]``, ids >= ``table_rows`` -> row 0
    (Gemma 3n's rule for a per-layer vocabulary smaller than the main one)."""
    return torch.where(input_ids < table_rows, input_ids, torch.zeros_like(input_ids))


def frequency_rows(counts: torch.Tensor, table_rows: int) -> torch.Tensor:
    """``ple.vocab_remap=frequency``: the table row of every token id, ``counts [V]`` -> ``[V]`` (int64).

    The ``table_rows - 1`` most frequent ids (training-split counts; ties go to the lower id) get rows
    ``1 … table_rows - 1`` in order of frequency; every other id shares row 0, the out-of-vocabulary row (where
    Gemma 3n's rule sends ids >= Vp). More tokens per row without merging any frequent token with another.
    """
    counts = torch.as_tensor(counts).to(torch.int64).cpu()
    if not 2 <= table_rows <= len(counts):
        raise ValueError(f"frequency_rows needs 2 <= table_rows <= {len(counts)} (the vocabulary), got {table_rows}")
    # a stable sort by descending count keeps the lower id first among equal counts
    kept = torch.sort(-counts, stable=True).indices[: table_rows - 1]
    rows = torch.zeros(len(counts), dtype=torch.int64)
    rows[kept] = torch.arange(1, table_rows, dtype=torch.int64)
    return rows


class IIDTableIds:
    """The null control's table ids (``ple.ids=iid``): every occurrence drawn i.i.d. from the real ids'
    frequencies, so the rows a token looks up carry no information about it.

    ``counts [Vp]``: how often each row is looked up by the real ids (training split). ``slots``: rows each position
    looks up (a hashed n-gram table's ``S``; its draws are then ``[B,T,S]``).
    """

    def __init__(self, counts: torch.Tensor, slots: int = 1) -> None:
        counts = counts.to(torch.float64)
        self.probs = (counts / counts.sum()).float()
        self.slots = slots

    def draw(self, like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Ids of ``like``'s shape (with a last axis of ``slots`` when there are several) on ``like``'s device; the
        draw happens where ``probs`` lives, from ``generator`` (or the global generator of that device)."""
        shape = (*like.shape, self.slots) if self.slots > 1 else tuple(like.shape)
        draws = torch.multinomial(self.probs, like.numel() * self.slots, replacement=True, generator=generator)
        return draws.view(shape).to(like.device)


def keep_unregistered(owner: nn.Module, name: str, module: nn.Module | None) -> None:
    """Keep ``module`` on ``owner`` as a plain attribute: its tensors are registered on ``owner`` already."""
    object.__setattr__(owner, name, module)


class PerLayerEmbedding(nn.Module):
    """Per-layer inputs from the token-identity table and the model-level projection (see module doc).

    ``vocab_size`` is Vp (HF ``vocab_size_per_layer_input``), ``dim`` is dP (``hidden_size_per_layer_input``).
    ``embed_scale`` multiplies the lookup (None: Gemma's ``sqrt(dim)``). ``sparse`` gives the table sparse
    row gradients (``nn.Embedding(sparse=True)``). A table kept on another device than ``e`` (host memory
    under a GPU trunk) is read there: only the looked-up rows travel. It has no ``init`` option: ``P`` reaches the
    residual stream only through the injections, whose ``init="function-preserving"`` makes the start unchanged
    (the table then trains from the second step).
    """

    def __init__(self, vocab_size: int, hidden_size: int, num_layers: int, dim: int, *, eps: float = 1e-6,
                 embed_scale: float | None = None, sparse: bool = False, register_on: nn.Module | None = None) -> None:
        super().__init__()
        owner = self if register_on is None else register_on
        owner.embed_tokens_per_layer = nn.Embedding(vocab_size, num_layers * dim, sparse=sparse)
        owner.per_layer_model_projection = nn.Linear(hidden_size, num_layers * dim, bias=False)
        owner.per_layer_projection_norm = RMSNorm(dim, eps)
        keep_unregistered(self, "owner", owner)
        self.num_layers, self.dim = num_layers, dim
        self.embed_scale = math.sqrt(dim) if embed_scale is None else embed_scale
        self.projection_scale = hidden_size ** -0.5
        self.input_scale = 2.0 ** -0.5
        if register_on is None:
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, table_std: float | None = None,
                         generator: torch.Generator | None = None) -> None:
        """HF's init convention: normal(0, std) projection, normal(0, table_std or std) table, norm weight 1."""
        o = self.owner
        o.embed_tokens_per_layer.weight.normal_(0.0, std if table_std is None else table_std, generator=generator)
        o.per_layer_model_projection.weight.normal_(0.0, std, generator=generator)
        o.per_layer_projection_norm.weight.fill_(1.0)

    def token_part(self, table_ids: torch.Tensor) -> torch.Tensor:
        """``z = s · T[ids]``: ``table_ids [B,T]`` -> ``[B,T,L,dP]``."""
        table = self.owner.embed_tokens_per_layer
        if table.weight.device != table_ids.device:
            rows = HostToDevice.apply(table(table_ids.to(table.weight.device)), table_ids.device)
        else:
            rows = table(table_ids)
        return (rows * self.embed_scale).view(*table_ids.shape, self.num_layers, self.dim)

    def projection_part(self, inputs_embeds: torch.Tensor) -> torch.Tensor:
        """``c = RMSNorm_dP((W_m e) · H^-½)``: ``inputs_embeds [B,T,H]`` -> ``[B,T,L,dP]``."""
        o = self.owner
        c = o.per_layer_model_projection(inputs_embeds) * self.projection_scale
        return o.per_layer_projection_norm(c.view(*inputs_embeds.shape[:-1], self.num_layers, self.dim))

    def forward(self, inputs_embeds: torch.Tensor, table_ids: torch.Tensor | None = None,
                token_part: torch.Tensor | None = None) -> torch.Tensor:
        """``P = (c + z) · 2^-½``: ``inputs_embeds [B,T,H]`` and ``table_ids [B,T]`` -> ``[B,T,L,dP]``.

        ``token_part [B,T,L,dP]`` replaces the lookup ``z`` when given (e.g. rows of a visual table).
        """
        if token_part is None and table_ids is None:
            raise ValueError("PerLayerEmbedding needs table_ids [B,T] (or a token_part [B,T,L,dP])")
        c = self.projection_part(inputs_embeds)
        z = self.token_part(table_ids) if token_part is None else token_part
        return (c + z) * self.input_scale


class PerLayerInjection(nn.Module):
    """One layer's PLE branch, added to the residual stream after the MLP (see module doc).

    ``gate``: ``gemma`` (Gemma 3n / 4), ``scalar`` / ``vector`` (the seed's learned gate, one number or
    one per hidden unit, starting at ``gate_init``) or ``none``.

    ``init``: ``"gemma"`` is HF's (normal(0, std) matrices, norm weight 1). Under the ``gemma`` gate the branch is
    then post-normed to RMS ≈ 1 whatever the stream's scale: in a decoder whose residual stream is small (a
    nanoGPT with std-0.02 embeddings) the branch starts larger than the stream — a standalone module warns at its
    first call when RMS(branch) > ``LARGE_BRANCH_RATIO`` · RMS(h). ``"function-preserving"`` is the same with the
    branch's last factor at zero — the post-norm weight (``gemma``), the learned gate (``scalar`` / ``vector``) or
    the projection (``none``) — so the branch is exactly 0 at step 0 (the model's output equals the model without
    PLE); the zeroed factor gets a gradient at the first step and every other PLE tensor from the second. (Zeroing
    the projection under the Gemma gate would feed the post-norm an exact zero, which is unstable.) The
    :class:`PerLayerEmbedding` has no such option: its ``P`` reaches the stream only through the injections.
    With ``register_on`` the owner's init sets the values (:meth:`reset_parameters`, which applies ``init``).
    """

    def __init__(self, hidden_size: int, dim: int, gate: str = "gemma", *, eps: float = 1e-6,
                 gate_init: float = 1.0, init: str = "gemma", register_on: nn.Module | None = None) -> None:
        super().__init__()
        if gate not in GATE_KINDS:
            raise ValueError(f"unknown PLE gate {gate!r}: choose one of {', '.join(GATE_KINDS)}")
        if init not in INITS:
            raise ValueError(f"unknown PLE init {init!r}: choose one of {', '.join(INITS)}")
        owner = self if register_on is None else register_on
        owner.per_layer_projection = nn.Linear(dim, hidden_size, bias=False)
        if gate == "gemma":
            owner.per_layer_input_gate = nn.Linear(hidden_size, dim, bias=False)
            owner.post_per_layer_input_norm = RMSNorm(hidden_size, eps)
        elif gate in ("scalar", "vector"):
            owner.per_layer_gate = nn.Parameter(torch.empty(1 if gate == "scalar" else hidden_size))
        keep_unregistered(self, "owner", owner)
        self.gate, self.gate_init, self.init = gate, gate_init, init
        # only a module built on its own checks its first branch (plelab's model and attach choose their init)
        self.check_scale = register_on is None and init == "gemma"
        if register_on is None:
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, generator: torch.Generator | None = None) -> None:
        """HF's init convention: normal(0, std) matmul weights, norm weight 1, the learned gate at ``gate_init``;
        then, under ``init="function-preserving"``, the branch's last factor at zero (class doc)."""
        o = self.owner
        o.per_layer_projection.weight.normal_(0.0, std, generator=generator)
        if self.gate == "gemma":
            o.per_layer_input_gate.weight.normal_(0.0, std, generator=generator)
            o.post_per_layer_input_norm.weight.fill_(1.0)
        elif self.gate in ("scalar", "vector"):
            o.per_layer_gate.fill_(self.gate_init)
        if self.init == "function-preserving":
            last = {"gemma": "post_per_layer_input_norm", "scalar": "per_layer_gate", "vector": "per_layer_gate",
                    "none": "per_layer_projection"}[self.gate]
            weight = getattr(o, last)
            (weight if isinstance(weight, nn.Parameter) else weight.weight).zero_()

    def forward(self, h: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """``h [B,T,H]``, ``p [B,T,dP]`` -> the branch ``[B,T,H]``."""
        o = self.owner
        if self.gate == "gemma":
            u = F.gelu(o.per_layer_input_gate(h), approximate="tanh") * p
            out = o.post_per_layer_input_norm(o.per_layer_projection(u))
        else:
            out = o.per_layer_projection(p)
            if self.gate in ("scalar", "vector"):
                out = out * o.per_layer_gate
        if self.check_scale and not torch.compiler.is_compiling():
            self.check_scale = False
            _warn_if_large(out, h)
        return out


def _warn_if_large(branch: torch.Tensor, h: torch.Tensor) -> None:
    """The first-call check of a standalone ``init="gemma"`` injection (:class:`PerLayerInjection`)."""
    ratio = float(branch.detach().float().pow(2).mean().sqrt() / h.detach().float().pow(2).mean().sqrt()
                  .clamp_min(1e-30))
    if ratio > LARGE_BRANCH_RATIO:
        warnings.warn(f"PerLayerInjection: at its first call the PLE branch's RMS is {ratio:.3g}x the residual "
                      "stream's it is added to; the model starts far from itself without PLE. Build the "
                      "injections with init='function-preserving' for an unchanged start", stacklevel=5)


def find_ple_modules(model: nn.Module) -> tuple[list[PerLayerEmbedding], list[tuple[PerLayerInjection, nn.Module]]]:
    """Every :class:`PerLayerEmbedding` and every ``(PerLayerInjection, the module holding it)`` in ``model``, found
    by type wherever they sit: registered submodules under any attribute name, and modules kept as plain
    attributes (plelab's model and :func:`plelab.attach` keep them so, their tensors registered on the holder).
    Each module once, in the order ``model.modules()`` reaches its holder (registration order)."""
    seen: set[int] = set()
    embeddings, injections = [], []
    for holder in model.modules():
        for value in (*holder._modules.values(), *vars(holder).values()):
            if isinstance(value, (PerLayerEmbedding, PerLayerInjection)) and id(value) not in seen:
                seen.add(id(value))
                if isinstance(value, PerLayerEmbedding):
                    embeddings.append(value)
                else:
                    injections.append((value, holder))
    return embeddings, injections


class PLEModules:
    """The PLE modules inside a model, found by type wherever they sit (:func:`find_ple_modules`; no registration
    call): ``embedding`` (the one :class:`PerLayerEmbedding`), ``injections`` (one :class:`PerLayerInjection` per
    layer, in layer order = registration order) and ``layers`` (the module holding each injection: a decoder block,
    whose other parameters are the layer's trunk in the gradient diagnostics).

    Works for plelab's model, for an HF decoder after :func:`plelab.attach` and for your own decoder built from the
    two modules under any attribute names; raises ``LookupError`` when the model has none (``ple.dim=0``, or a model
    PLE was never added to) or not one embedding and one injection per layer.
    """

    def __init__(self, model: nn.Module) -> None:
        embeddings, found = find_ple_modules(model)
        self.injections = [injection for injection, _ in found]
        self.layers = [holder for _, holder in found]
        if len(embeddings) != 1 or len(self.injections) != embeddings[0].num_layers:
            expected = f" (its embedding has L = {embeddings[0].num_layers})" if len(embeddings) == 1 else ""
            raise LookupError(f"the model has {len(embeddings)} per-layer embeddings and {len(self.injections)} "
                              f"per-layer injections{expected}; PLE modules are one embedding and one injection "
                              "per layer")
        self.embedding: PerLayerEmbedding = embeddings[0]

    @property
    def table(self) -> nn.Parameter:
        """The per-layer table ``[Vp, L·dP]`` (HF ``embed_tokens_per_layer.weight``)."""
        return self.embedding.owner.embed_tokens_per_layer.weight

    @property
    def dim(self) -> int:
        return self.embedding.dim

    @property
    def num_layers(self) -> int:
        return self.embedding.num_layers

    def parameters(self) -> list[nn.Parameter]:
        """Every PLE tensor (table, model projection and norm, each layer's gate, projection and norm)."""
        owners = [(self.embedding.owner, ("embed_tokens_per_layer", "per_layer_model_projection",
                                          "per_layer_projection_norm"))]
        owners += [(inj.owner, ("per_layer_input_gate", "per_layer_projection", "post_per_layer_input_norm"))
                   for inj in self.injections]
        out = [p for owner, names in owners for n in names if hasattr(owner, n) for p in getattr(owner, n).parameters()]
        return out + [inj.owner.per_layer_gate for inj in self.injections if inj.gate in ("scalar", "vector")]
