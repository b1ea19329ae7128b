"""Parity of plelab's PLE with HF transformers' Gemma 4 (the maintained PLE implementation).

A tiny random ``Gemma4ForCausalLM`` with PLE is built locally (nothing is downloaded); its
PLE tensors are loaded into plelab *by name* (the names are identical), and the per-layer
inputs [B, T, L, dP] and every layer's PLE branch output are compared in fp32.
"""

import pytest
import torch

from plelab.config import resolve_config
from plelab.model import build_model

transformers = pytest.importorskip("transformers", minversion="5.5", reason="pip install -e '.[test]'")

H, L, dP, V, HEADS, KV, HD = 64, 3, 16, 512, 4, 2, 16
PLE_KEYS = ("embed_tokens_per_layer", "per_layer_model_projection", "per_layer_projection_norm",
            "per_layer_input_gate", "per_layer_projection", "post_per_layer_input_norm")


@pytest.fixture(scope="module")
def pair():
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    hf_cfg = Gemma4TextConfig(vocab_size=V, hidden_size=H, intermediate_size=128, num_hidden_layers=L,
                              num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=HD,
                              hidden_size_per_layer_input=dP, vocab_size_per_layer_input=V,
                              layer_types=["full_attention"] * L, max_position_embeddings=64)
    torch.manual_seed(0)
    hf = Gemma4ForCausalLM(hf_cfg).eval()
    gen = torch.Generator().manual_seed(123)
    with torch.no_grad():  # randomise every PLE tensor, norms included, so that nothing is trivially 1 or 0
        for name, p in hf.named_parameters():
            if any(k in name for k in PLE_KEYS) or name == "model.embed_tokens.weight":
                p.copy_(torch.randn(p.shape, generator=gen) * (0.5 if "norm" in name else 0.05) + ("norm" in name))
    cfg = resolve_config("cpu-tiny", [f"model.vocab_size={V}", f"model.hidden_size={H}", f"model.num_hidden_layers={L}",
                                      f"model.num_attention_heads={HEADS}", f"model.num_key_value_heads={KV}",
                                      f"model.head_dim={HD}", "model.intermediate_size=128"], dp=dP)
    ours = build_model(cfg.model, cfg.ple, seed=0).eval()
    hf_state = hf.state_dict()
    shared = {k: v for k, v in hf_state.items() if any(s in k for s in PLE_KEYS) or k == "model.embed_tokens.weight"}
    missing, _ = ours.load_state_dict(shared, strict=False)
    ours_ple = {n for n, _ in ours.named_parameters() if any(s in n for s in PLE_KEYS)}
    assert ours_ple and ours_ple <= set(shared), "PLE tensor names differ from HF Gemma 4"
    assert not set(shared) & set(missing)
    return hf, ours


def _capture(hf, ids):
    """Run HF and record, per layer, the per-layer input, the branch input h and the branch output."""
    rec = {"p": {}, "h": {}, "out": {}}
    hooks = []
    for i, layer in enumerate(hf.model.layers):
        def pre(mod, args, kwargs, i=i):
            rec["p"][i] = kwargs["per_layer_input"] if "per_layer_input" in kwargs else args[1]
        hooks.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
        hooks.append(layer.per_layer_input_gate.register_forward_hook(
            lambda m, a, o, i=i: rec["h"].__setitem__(i, a[0].detach().clone())))
        hooks.append(layer.post_per_layer_input_norm.register_forward_hook(
            lambda m, a, o, i=i: rec["out"].__setitem__(i, o.detach().clone())))
    with torch.no_grad():
        hf(input_ids=ids)
    for h in hooks:
        h.remove()
    return rec


def test_per_layer_inputs_match_hf_gemma4(pair):
    hf, ours = pair
    ids = torch.randint(0, V, (2, 13), generator=torch.Generator().manual_seed(1))
    rec = _capture(hf, ids)
    hf_P = torch.stack([rec["p"][i] for i in range(L)], dim=2)
    with torch.no_grad():
        P = ours.model.per_layer_inputs(ids, ours.model.embed(ids))
        direct = hf.model.project_per_layer_inputs(hf.model.embed_tokens(ids), hf.model.get_per_layer_inputs(ids))
    assert P.shape == hf_P.shape == (2, 13, L, dP)
    assert (P - hf_P).abs().max().item() <= 1e-5
    assert (P - direct).abs().max().item() <= 1e-5


def test_every_layer_ple_branch_matches_hf_gemma4(pair):
    hf, ours = pair
    ids = torch.randint(0, V, (2, 13), generator=torch.Generator().manual_seed(2))
    rec = _capture(hf, ids)
    with torch.no_grad():
        P = ours.model.per_layer_inputs(ids, ours.model.embed(ids))
        for i in range(L):
            branch = ours.model.layers[i].ple_branch(rec["h"][i], P[:, :, i])
            err = (branch - rec["out"][i]).abs().max().item()
            assert err <= 1e-5, f"layer {i}: max abs error {err}"
            assert branch.abs().max().item() > 0.1  # a real signal, not two zeros


def test_load_hf_weights_maps_both_naming_schemes(pair):
    import plelab

    hf, _ = pair
    cfg = resolve_config("cpu-tiny", [f"model.vocab_size={V}", f"model.hidden_size={H}", f"model.num_hidden_layers={L}",
                                      f"model.num_attention_heads={HEADS}", f"model.num_key_value_heads={KV}",
                                      f"model.head_dim={HD}", "model.intermediate_size=128"], dp=dP)
    text_names = {k: v for k, v in hf.state_dict().items()  # the PLE part (Gemma 4's attention shapes differ)
                  if any(s in k for s in PLE_KEYS) or k == "model.embed_tokens.weight"}
    multimodal = {k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k: v
                  for k, v in text_names.items()}
    multimodal["model.vision_tower.patch.weight"] = torch.zeros(3)
    fresh = build_model(cfg.model, cfg.ple, seed=1)
    missing, _ = fresh.load_state_dict(multimodal, strict=False)  # the trap: nothing loads, nothing errors
    assert set(missing) == set(fresh.state_dict())
    a, b = build_model(cfg.model, cfg.ple, seed=1), build_model(cfg.model, cfg.ple, seed=2)
    ra, rb = plelab.load_hf_weights(a, text_names), plelab.load_hf_weights(b, multimodal)
    assert ra.loaded == rb.loaded and "model.embed_tokens_per_layer.weight" in ra.loaded
    assert rb.unused == ["model.vision_tower.patch.weight"]
    sa, sb = a.state_dict(), b.state_dict()
    assert all(torch.equal(sa[n], sb[n]) and torch.equal(sa[n], text_names[n]) for n in ra.loaded)
    assert set(ra.left).isdisjoint(ra.loaded) and ra.line().startswith(f"loaded {len(ra.loaded)} tensors")
    bad = {"model.embed_tokens_per_layer.weight": torch.zeros(3, 3)}
    with pytest.raises(plelab.PlelabError, match="the checkpoint is for another configuration"):
        plelab.load_hf_weights(a, bad)
    with pytest.raises(plelab.PlelabError, match="none of the 1 source tensors match"):
        plelab.load_hf_weights(a, {"vision.x": torch.zeros(1)})
