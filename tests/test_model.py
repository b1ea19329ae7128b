import time

import pytest
import torch

from plelab.config import resolve_config
from plelab.model import build_model
from plelab.model.init import init_spec


def _model(dp=16, gate="gemma", seed=0, overrides=()):
    cfg = resolve_config("cpu-tiny", list(overrides), dp=dp, gate=gate)
    return build_model(cfg.model, cfg.ple, seed=seed), cfg


@pytest.mark.parametrize("gate", ["gemma", "scalar", "vector", "none"])
def test_shapes_and_loss_for_every_gate_variant(gate):
    model, cfg = _model(gate=gate)
    B, T = 3, 11
    ids = torch.randint(0, cfg.model.vocab_size, (B, T))
    out = model(ids, labels=ids)
    assert out.logits.shape == (B, T, cfg.model.vocab_size)
    assert out.loss.ndim == 0 and torch.isfinite(out.loss)
    tm = model.model
    e = tm.embed(ids)
    P = tm.per_layer_inputs(ids, e)
    assert P.shape == (B, T, cfg.model.num_hidden_layers, cfg.ple.dim)
    branch = tm.layers[0].ple_branch(torch.randn(B, T, cfg.model.hidden_size), P[:, :, 0])
    assert branch.shape == (B, T, cfg.model.hidden_size)
    out.loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_gate_variants_have_the_seed_and_gemma_tensors():
    names = {g: {n for n, _ in _model(gate=g)[0].named_parameters() if ".layers.0." in n and "per_layer" in n}
             for g in ("gemma", "scalar", "vector", "none")}
    assert names["gemma"] == {"model.layers.0.per_layer_input_gate.weight",
                              "model.layers.0.per_layer_projection.weight",
                              "model.layers.0.post_per_layer_input_norm.weight"}
    assert names["scalar"] == {"model.layers.0.per_layer_projection.weight", "model.layers.0.per_layer_gate"}
    assert names["vector"] == names["scalar"]
    assert names["none"] == {"model.layers.0.per_layer_projection.weight"}
    vec = _model(gate="vector")[0].model.layers[0].per_layer_gate
    assert vec.shape == (64,) and torch.all(vec == 1.0)


def test_dp0_is_exactly_the_baseline_and_the_trunk_is_shared_across_dp_and_gates():
    base, _ = _model(dp=0)
    assert not any("per_layer" in n for n, _ in base.named_parameters())
    base_state = base.state_dict()
    for dp, gate in [(16, "gemma"), (32, "scalar"), (8, "none")]:
        m, _ = _model(dp=dp, gate=gate)
        state = m.state_dict()
        for name, value in base_state.items():
            assert torch.equal(state[name], value), name
    # With the injection silenced (W_p = 0), a dP>0 model computes exactly the baseline function.
    m, cfg = _model(dp=16, gate="gemma")
    with torch.no_grad():
        for layer in m.model.layers:
            layer.per_layer_projection.weight.zero_()
    ids = torch.randint(0, cfg.model.vocab_size, (2, 9))
    # RMSNorm of an all-zero vector is zero, so the Gemma branch adds exactly 0.
    assert torch.equal(m(ids).logits, base(ids).logits)


def test_init_is_seeded_per_parameter_name():
    a, _ = _model(seed=1)
    b, _ = _model(seed=1)
    c, _ = _model(seed=2)
    for (n, p), (_, q), (_, r) in zip(a.named_parameters(), b.named_parameters(), c.named_parameters()):
        assert torch.equal(p, q), n
        if p.ndim == 2:
            assert not torch.equal(p, r), n
    spec = init_spec(a)
    assert spec["model.layers.0.input_layernorm.weight"] == ("ones", 1.0)
    assert spec["model.embed_tokens_per_layer.weight"] == ("normal", 0.02)
    w = a.model.embed_tokens_per_layer.weight
    assert abs(w.std().item() - 0.02) < 0.002 and torch.all(w[0] != 0)  # no padding row
    assert torch.all(a.model.norm.weight == 1)


def test_table_init_std_override():
    m, _ = _model(overrides=["ple.table_init_std=0.5"])
    assert abs(m.model.embed_tokens_per_layer.weight.std().item() - 0.5) < 0.05


def test_meta_build_of_3b_is_instant_and_allocates_nothing():
    cfg = resolve_config("seed-3b")
    t = time.perf_counter()
    model = build_model(cfg.model, cfg.ple, device="meta")
    assert time.perf_counter() - t < 5.0
    assert all(p.is_meta for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == 3_341_404_928


def test_causal_future_tokens_do_not_change_past_logits():
    m, cfg = _model()
    ids = torch.randint(0, cfg.model.vocab_size, (1, 12))
    changed = ids.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % cfg.model.vocab_size
    with torch.no_grad():
        a, b = m(ids).logits, m(changed).logits
    assert torch.allclose(a[:, :8], b[:, :8], atol=1e-6)
    assert not torch.allclose(a[:, 8:], b[:, 8:])


def test_ids_outside_the_per_layer_vocab_use_row_zero():
    m, cfg = _model(overrides=["ple.vocab_size=100"])
    tm = m.model
    assert tm.embed_tokens_per_layer.weight.shape == (100, cfg.model.num_hidden_layers * 16)
    ids = torch.tensor([[150, 0, 99, 511]])
    z = tm.per_layer_token_embeddings(ids)
    assert torch.equal(z[0, 0], z[0, 1]) and not torch.equal(z[0, 2], z[0, 1])
    assert torch.equal(z[0, 3], z[0, 1])
    expected = tm.embed_tokens_per_layer.weight[99].view(cfg.model.num_hidden_layers, 16) * 4.0  # sqrt(16)
    assert torch.allclose(z[0, 2], expected)


def test_per_layer_inputs_follow_the_reference_equation():
    m, cfg = _model()
    tm, H, L, dP = m.model, cfg.model.hidden_size, cfg.model.num_hidden_layers, cfg.ple.dim
    ids = torch.randint(0, cfg.model.vocab_size, (2, 5))
    with torch.no_grad():
        e = tm.embed_tokens.weight[ids] * H ** 0.5
        z = (tm.embed_tokens_per_layer.weight[ids] * dP ** 0.5).view(2, 5, L, dP)
        c = (e @ tm.per_layer_model_projection.weight.T * H ** -0.5).view(2, 5, L, dP)
        c = c / torch.sqrt(c.pow(2).mean(-1, keepdim=True) + 1e-6) * tm.per_layer_projection_norm.weight
        expected = (c + z) * 2 ** -0.5
        got = tm.per_layer_inputs(ids, tm.embed(ids))
    assert torch.allclose(got, expected, atol=1e-6)


def test_untied_head_and_unscaled_embeddings():
    m, cfg = _model(overrides=["model.tie_word_embeddings=false", "model.scale_embeddings=false"])
    assert m.lm_head.weight.shape == (cfg.model.vocab_size, cfg.model.hidden_size)
    assert m.model.embed_scale == 1.0
    ids = torch.randint(0, cfg.model.vocab_size, (1, 4))
    assert m(ids).logits.shape == (1, 4, cfg.model.vocab_size)


def test_labels_follow_hf_and_targets_are_the_pre_shifted_form():
    model, cfg = _model()
    w = torch.randint(0, cfg.model.vocab_size, (2, 13), generator=torch.Generator().manual_seed(1))
    pre_shifted = model(w[:, :-1], targets=w[:, 1:]).loss
    # the old call, spelled out: logits of w[:, :-1] against w[:, 1:] -- bit-identical to targets=
    logits = model(w[:, :-1]).logits
    old = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), w[:, 1:].reshape(-1),
                                            ignore_index=-100)
    assert torch.equal(pre_shifted, old)
    # HF: labels aligned with input_ids, shifted inside; the same next-token task on the same tokens
    hf = model(w, labels=w).loss
    assert torch.allclose(hf, pre_shifted, atol=1e-5)
    # -100 is ignored: masking the last label removes exactly the prediction of the last token
    masked = w.clone()
    masked[:, -1] = -100
    targets = torch.cat([w[:, 1:-1], torch.full((2, 1), -100)], 1)
    assert torch.allclose(model(w, labels=masked).loss, model(w[:, :-1], targets=targets).loss, atol=1e-5)
    with pytest.raises(ValueError, match="not both"):
        model(w, labels=w, targets=w)


def test_labels_equal_to_input_ids_is_language_modelling_not_a_copy_task():
    """On i.i.d. random tokens nothing is predictable: with HF labels the loss cannot fall far below ln V.
    (Unshifted labels would let each position copy its own input and drive the loss toward 0.)"""
    torch.manual_seed(0)
    model, cfg = _model()
    V = cfg.model.vocab_size
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        ids = torch.randint(0, V, (8, 32), generator=g)
        loss = model(ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() > 0.9 * torch.log(torch.tensor(float(V))).item(), loss.item()


def test_the_model_holds_no_state_besides_its_parameters():
    """Two forwards of the same inputs give the same output; nothing is written on the model by a forward, and
    the i.i.d. null control takes its ids as an argument (refused without them)."""
    model, cfg = _model(overrides=["ple.ids=iid"])
    before = {k: v for k, v in vars(model.model).items() if not k.startswith("_")}
    ids = torch.randint(0, cfg.model.vocab_size, (2, 9))
    with pytest.raises(ValueError, match="needs table_ids"):
        model(ids)
    from plelab import IIDTableIds

    iid = IIDTableIds(torch.ones(cfg.model.vocab_size))
    table_ids = iid.draw(ids, torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = model(ids, table_ids=table_ids).logits
        b = model(ids, table_ids=table_ids).logits
    assert torch.equal(a, b)
    assert {k: v for k, v in vars(model.model).items() if not k.startswith("_")}.keys() == before.keys()
    assert not any(hasattr(m, attr) for m in model.modules()
                   for attr in ("probe", "iid_probs", "iid_generator", "last_table_ids"))


def test_a_sparse_table_is_decided_when_the_model_is_built():
    cfg = resolve_config("cpu-tiny", dp=8)
    dense = build_model(cfg.model, cfg.ple, seed=0)
    sparse = build_model(cfg.model, cfg.ple, seed=0, table_sparse=True)
    assert not dense.model.embed_tokens_per_layer.sparse and sparse.model.embed_tokens_per_layer.sparse
    assert all(torch.equal(a, b) for a, b in zip(dense.state_dict().values(), sparse.state_dict().values()))
    ids = torch.randint(0, cfg.model.vocab_size, (2, 9))
    sparse(ids, labels=ids).loss.backward()
    assert sparse.model.embed_tokens_per_layer.weight.grad.is_sparse
