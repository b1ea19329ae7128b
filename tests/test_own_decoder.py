"""PLE in a user's own decoder (issue 53, 1): a nanoGPT-shaped model holding ``plelab.PerLayerEmbedding`` and
``plelab.PerLayerInjection`` under its own attribute names gets the table's optimizer group, a working Monitor, a
function-preserving start and a use test whatever its forward returns."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import plelab
from plelab.config.schema import GATE_KINDS
from plelab.errors import PlelabError

V, H, L, DP, T = 96, 32, 2, 8, 12


class Block(nn.Module):
    """nanoGPT's block (attn, mlp) with the PLE branch under a name plelab never uses."""

    def __init__(self, gate: str, init: str) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(H), nn.LayerNorm(H)
        self.attn = nn.MultiheadAttention(H, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(H, 4 * H), nn.GELU(), nn.Linear(4 * H, H))
        for p in [*self.attn.parameters(), *self.mlp.parameters()]:  # nanoGPT's init: normal(0, 0.02), zero biases
            nn.init.normal_(p, std=0.02) if p.ndim == 2 else nn.init.zeros_(p)
        self.side_branch = plelab.PerLayerInjection(H, DP, gate, init=init)

    def forward(self, x, p):
        a = self.ln_1(x)
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool), 1)
        x = x + self.attn(a, a, a, attn_mask=mask, need_weights=False)[0]
        x = x + self.mlp(self.ln_2(x))
        return x if p is None else x + self.side_branch(x, p)


class TinyGPT(nn.Module):
    """``idx [B,T]`` -> ``(logits [B,T,V], loss)`` (``returns="tuple"``, nanoGPT's) or ``logits`` (``"tensor"``)."""

    def __init__(self, gate: str = "gemma", init: str = "function-preserving", returns: str = "tuple") -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, H), nn.Embedding(T, H)
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe.weight, std=0.02)
        self.token_identity = plelab.PerLayerEmbedding(V, H, L, DP)
        self.h = nn.ModuleList(Block(gate, init) for _ in range(L))
        self.ln_f = nn.LayerNorm(H)
        self.returns, self.use_ple = returns, True

    def forward(self, idx, targets=None):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        P = self.token_identity(x, idx) if self.use_ple else None  # [B,T,L,dP]
        for i, block in enumerate(self.h):
            x = block(x, None if P is None else P[:, :, i])
        logits = F.linear(self.ln_f(x), self.wte.weight)
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return (logits, loss) if self.returns == "tuple" else logits


def batches(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, V, (n, T + 1), generator=torch.Generator().manual_seed(seed))


def test_the_table_gets_its_own_group_at_table_lr_under_any_attribute_name():
    torch.manual_seed(0)
    model = TinyGPT()
    groups = {g["name"]: g for g in plelab.param_groups(model, lr=3e-3, table_lr=1e-2, weight_decay=0.1)}
    table = model.token_identity.embed_tokens_per_layer.weight
    assert groups["ple_table"]["params"] == [table]
    assert groups["ple_table"]["lr"] == 1e-2 and groups["ple_table"]["weight_decay"] == 0.0
    assert all(p is not table for g in ("decay", "no_decay") for p in groups[g]["params"])
    assert groups["decay"]["lr"] == 3e-3 and groups["decay"]["weight_decay"] == 0.1


def test_modules_are_found_by_type_in_layer_order():
    torch.manual_seed(0)
    model = TinyGPT()
    ple = plelab.PLEModules(model)
    assert ple.embedding is model.token_identity
    assert ple.injections == [b.side_branch for b in model.h] and ple.layers == list(model.h)
    assert (ple.num_layers, ple.dim, tuple(ple.table.shape)) == (L, DP, (V, L * DP))


def test_options_that_cannot_be_honoured_are_refused():
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Embedding(V, H), nn.Linear(H, V))
    with pytest.raises(PlelabError, match="table_lr / table_weight_decay given but the model has no per-layer table"):
        plelab.param_groups(plain, lr=1e-3, table_lr=1e-2)
    with pytest.raises(PlelabError, match="no per-layer table"):
        plelab.param_groups(plain, lr=1e-3, table_weight_decay=0.1)
    assert [g["name"] for g in plelab.param_groups(plain, lr=1e-3)] == ["decay", "no_decay"]
    frozen = TinyGPT()
    frozen.token_identity.embed_tokens_per_layer.weight.requires_grad_(False)
    with pytest.raises(PlelabError, match="frozen"):
        plelab.param_groups(frozen, lr=1e-3, table_lr=1e-2)
    short = TinyGPT()
    short.h = short.h[:1]  # one injection for an embedding of L = 2 layers
    with pytest.raises(PlelabError, match=r"1 per-layer injections \(its embedding has L = 2\)"):
        plelab.param_groups(short, lr=1e-3)
    with pytest.raises(PlelabError, match="plelab.PerLayerEmbedding / PerLayerInjection"):
        plelab.Monitor(plain, "unused", every=0)


@pytest.mark.parametrize("gate", GATE_KINDS)
def test_function_preserving_start_and_every_ple_tensor_learns(gate):
    torch.manual_seed(0)
    model = TinyGPT(gate)
    ids = batches(4)
    with torch.no_grad():
        with_ple = model(ids[:, :-1])[0]
        model.use_ple = False
        without = model(ids[:, :-1])[0]
        model.use_ple = True
    assert float((with_ple - without).abs().max()) == 0.0
    ple = plelab.PLEModules(model).parameters()
    opt = plelab.adamw(plelab.param_groups(model, lr=1e-2, table_lr=3e-2))
    got_grad = {id(p): False for p in ple}
    for step in range(3):
        x = batches(4, seed=step + 1)
        model(x[:, :-1], x[:, 1:])[1].backward()
        for p in ple:
            got_grad[id(p)] |= bool(p.grad is not None and p.grad.abs().sum() > 0)
        opt.step()
        opt.zero_grad()
    assert all(got_grad.values()), f"PLE tensors without gradient after 3 steps: {sum(not v for v in got_grad.values())}"


def test_default_init_warns_when_the_branch_dwarfs_the_stream():
    torch.manual_seed(0)
    ids = batches(2)[:, :-1]
    with pytest.warns(UserWarning, match=r"branch's RMS is .*x the residual stream's.*init='function-preserving'"):
        TinyGPT(init="gemma")(ids)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TinyGPT()(ids)  # function-preserving: no warning


@pytest.mark.parametrize("returns", ["tuple", "tensor"])
def test_use_test_runs_on_tuple_and_tensor_forwards(returns, tmp_path):
    torch.manual_seed(0)
    model = TinyGPT(returns=returns)
    logits_of = (lambda out: out[0]) if returns == "tuple" else None
    opt = plelab.adamw(plelab.param_groups(model, lr=1e-2, table_lr=3e-2))
    data = batches(16, seed=1)
    with plelab.Monitor(model, tmp_path, every=2, checkpoint_every=4, val_windows=batches(6, seed=9),
                        logits_of=logits_of) as monitor:
        for step in range(4):
            x = data[4 * step:4 * step + 4]
            logits = model(x[:, :-1])
            logits = logits[0] if returns == "tuple" else logits
            F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten()).backward()
            monitor.step(step)
            opt.step()
            opt.zero_grad()
    saved = json.loads((tmp_path / "checkpoints" / "step-000004" / "diagnostics.json").read_text())
    assert saved["use"]["permute"]["windows"] == 6 and saved["val_loss"] > 0
    assert saved["rows_used"] > 0 and len(saved["layers"]) == L
    diag = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["diag"]
    assert all(v is not None and v > 0 for v in diag["grad_trunk"] + diag["grad_table"])


def test_use_test_says_what_it_needs_from_the_forward(tmp_path):
    torch.manual_seed(0)
    model = TinyGPT(returns="tuple")
    with pytest.raises(PlelabError, match="returned a tuple, which holds no .logits: pass logits_of="):
        plelab.Monitor(model, tmp_path, every=0, val_windows=batches(2)).checkpoint(1)
    last_only = plelab.Monitor(model, tmp_path / "last", every=0, val_windows=batches(2),
                               logits_of=lambda out: out[0][:, -1:])  # nanoGPT's inference path: last position only
    with pytest.raises(PlelabError, match=r"logits for \(2, 12\) input ids are \(2, 1, 96\); the use test needs"):
        last_only.checkpoint(1)
