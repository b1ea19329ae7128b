"""plelab.attach on HF decoders, as an outside user: tiny random models built locally, nothing downloaded."""

from __future__ import annotations

import pytest
import torch
import transformers
from hf_models import HIDDEN, LAYERS, VOCAB, batch, tiny_host

import plelab
from plelab.errors import PlelabError
from plelab.integrations.hf import SUPPORTED_MODEL_TYPES, check_transformers


def test_the_tested_families_are_the_supported_ones():
    assert set(SUPPORTED_MODEL_TYPES) == {"llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "gpt_neox"}


@pytest.mark.slow
@pytest.mark.parametrize("kind", SUPPORTED_MODEL_TYPES)
@pytest.mark.parametrize("gate", ["gemma", "scalar", "none"])
def test_function_preserving_start_and_every_ple_tensor_trains(kind, gate):
    host = tiny_host(kind).eval()
    ids = batch()
    with torch.no_grad():
        before = host(ids).logits
    rng = torch.random.get_rng_state()
    model = plelab.attach(host, 8, gate=gate)
    assert torch.equal(rng, torch.random.get_rng_state())  # attach leaves the user's global RNG alone
    assert model is host
    with torch.no_grad():
        assert (model(ids).logits - before).abs().max() <= 1e-6
    ple = plelab.PLEModules(model)
    names = {n for n, p in model.named_parameters() if any(p is q for q in ple.parameters())}
    prefix = "gpt_neox" if kind == "gpt_neox" else "model"
    assert f"{prefix}.embed_tokens_per_layer.weight" in names
    assert f"{prefix}.layers.1.per_layer_projection.weight" in names
    model.train()
    opt = plelab.adamw(plelab.param_groups(model, lr=1e-2, weight_decay=0.0))
    start = [p.detach().clone() for p in ple.parameters()]
    got_grad = [False] * len(start)
    for step in range(3):
        model(ids, labels=ids).loss.backward()
        for i, p in enumerate(ple.parameters()):
            got_grad[i] |= step < 2 and p.grad is not None and bool(p.grad.abs().sum() > 0)
        opt.step()
        opt.zero_grad()
    assert all(got_grad), "a PLE tensor had no gradient by step 2"
    assert all(not torch.equal(a, p) for a, p in zip(start, ple.parameters())), "a PLE tensor never moved"


def test_nothing_outlives_the_forward_even_when_it_raises():
    model = plelab.attach(tiny_host(), 8)
    frames = model.base_model.plelab_attachment.frames
    model(batch())
    assert frames.stack == []
    with pytest.raises(Exception):
        model(batch(), attention_mask=torch.ones(3, 3, 3, 3, 3))  # a broken mask: the host's forward raises
    assert frames.stack == []


def test_inputs_embeds_need_table_ids_and_then_agree():
    model = plelab.attach(tiny_host(), 8, init="gemma").eval()
    ids = batch()
    with pytest.raises(PlelabError, match="needs input_ids"):
        model(inputs_embeds=torch.randn(2, 5, HIDDEN))
    assert model.base_model.plelab_attachment.frames.stack == []  # a refused call leaves no frame behind
    with torch.no_grad():
        by_ids = model(ids).logits
        by_embeds = model(inputs_embeds=model.get_input_embeddings()(ids), table_ids=ids).logits
    assert torch.equal(by_ids, by_embeds)


def test_generation_with_the_kv_cache_matches_full_recomputation():
    model = plelab.attach(tiny_host(), 8, init="gemma").eval()
    prompt = batch(t=4)
    cached = model.generate(prompt, max_new_tokens=6, do_sample=False, use_cache=True,
                            attention_mask=torch.ones_like(prompt), pad_token_id=0)
    full = model.generate(prompt, max_new_tokens=6, do_sample=False, use_cache=False,
                          attention_mask=torch.ones_like(prompt), pad_token_id=0)
    assert torch.equal(cached, full)


def test_save_pretrained_round_trip_keeps_gemma_names(tmp_path):
    model = plelab.attach(tiny_host("qwen3"), 8, init="gemma", seed=3, vocab_size=64)
    ids = batch()
    with torch.no_grad():
        expected = model(ids).logits
    model.save_pretrained(tmp_path)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
    assert {"model.embed_tokens_per_layer.weight", "model.per_layer_model_projection.weight",
            "model.layers.0.per_layer_input_gate.weight", "model.layers.1.post_per_layer_input_norm.weight"} <= keys
    loaded = plelab.load_attached(tmp_path)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, expected)
    assert plelab.PLEModules(loaded).table.shape == (64, LAYERS * 8)


def test_load_attached_refuses_a_plain_folder(tmp_path):
    tiny_host().save_pretrained(tmp_path)
    with pytest.raises(PlelabError, match="not saved from a model with plelab.attach"):
        plelab.load_attached(tmp_path)


def test_param_groups_on_an_attached_model():
    model = plelab.attach(tiny_host(), 8, freeze_host=True)
    groups = {g["name"]: g for g in plelab.param_groups(model, lr=1e-3, table_lr=5e-3, weight_decay=0.1)}
    ple = plelab.PLEModules(model)
    assert groups["ple_table"]["params"] == [ple.table] and groups["ple_table"]["lr"] == 5e-3
    assert groups["ple_table"]["weight_decay"] == 0.0 and groups["no_decay"]["weight_decay"] == 0.0
    trained = [p for g in groups.values() for p in g["params"]]
    assert {id(p) for p in trained} == {id(p) for p in ple.parameters()}  # freeze_host: only PLE trains
    norms = [model.model.layers[0].post_per_layer_input_norm.weight, model.model.per_layer_projection_norm.weight]
    assert all(any(n is p for p in groups["no_decay"]["params"]) for n in norms)


def test_param_groups_equal_plelabs_own_on_its_model(tiny_cfg):
    from plelab.training.optim import optimizer_groups

    model = plelab.build_model(tiny_cfg.model, tiny_cfg.ple, seed=0)
    tc = tiny_cfg.train
    own = {g["name"]: {id(p) for p in g["params"]} for g in optimizer_groups(model, tc)}
    public = {g["name"]: {id(p) for p in g["params"]}
              for g in plelab.param_groups(model, lr=tc.lr, weight_decay=tc.weight_decay)}
    assert own == public and set(own) == {"decay", "no_decay", "ple_table"}


def test_row_sparse_table_trains_in_a_plain_loop():
    dense = plelab.attach(tiny_host(), 8, init="gemma")
    sparse = plelab.attach(tiny_host(), 8, init="gemma", sparse_table=True, table_device="cpu")
    groups = plelab.param_groups(sparse, lr=1e-2)
    assert [g.get("row_sparse", False) for g in groups if g["name"] == "ple_table"] == [True]
    opts = [plelab.adamw(plelab.param_groups(m, lr=1e-2)) for m in (dense, sparse)]
    ids = torch.arange(VOCAB).view(4, -1)  # every row looked up every step: lazy and dense AdamW agree
    for _ in range(3):
        for m, opt in zip((dense, sparse), opts):
            m(ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
    torch.testing.assert_close(plelab.PLEModules(sparse).table, plelab.PLEModules(dense).table, rtol=1e-5, atol=1e-6)


def test_gradient_checkpointing_is_refused_in_one_line():
    model = plelab.attach(tiny_host(), 8)
    model.gradient_checkpointing_enable()  # every 5.x (5.2x also spells it activation_checkpointing_enable)
    model.train()
    with pytest.raises(PlelabError, match="gradient checkpointing .* gradient_accumulation_steps"):
        model(batch(), labels=batch())


# ---- bad input: one line, PlelabError -------------------------------------------------------------------------

BAD_ATTACH = {
    "unsupported architecture": (lambda: (transformers.AutoModelForCausalLM.from_config(transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4)), 8), "does not support model_type 'gpt2'"),
    "dim above the hidden size": (lambda: (tiny_host(), HIDDEN + 1), "from 1 to the hidden size"),
    "dim zero": (lambda: (tiny_host(), 0), "from 1 to the hidden size"),
    "dim not an integer": (lambda: (tiny_host(), 8.0), "from 1 to the hidden size"),
    "not an HF model": (lambda: (torch.nn.Linear(4, 4), 8), "takes an HF transformers causal LM"),
}


@pytest.mark.parametrize("case", list(BAD_ATTACH))
def test_attach_refuses_in_one_line(case):
    build, needle = BAD_ATTACH[case]
    model, dim = build()
    with pytest.raises(PlelabError) as err:
        plelab.attach(model, dim)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_attach_refuses_twice_and_other_options():
    model = plelab.attach(tiny_host(), 8)
    with pytest.raises(PlelabError, match="attached already"):
        plelab.attach(model, 8)
    for kwargs, needle in (({"gate": "sigmoid"}, "unknown PLE gate"), ({"init": "zeros"}, "unknown PLE init"),
                           ({"vocab_size": VOCAB + 1}, "host's vocabulary")):
        with pytest.raises(PlelabError, match=needle):
            plelab.attach(tiny_host(), 8, **kwargs)


def test_a_transformers_outside_the_supported_range_is_refused():
    for version in ("4.46.0", "6.0.0", "6.1.0rc1"):
        with pytest.raises(PlelabError, match=rf"supports transformers 5.0 up to \(not including\) 6.0 .* this is "
                                              rf"{version}"):
            check_transformers(version)
        check_transformers(version, allow_untested=True)
    for version in ("5.0.0", "5.13.1", "5.25.0", "5.99.0.dev0", transformers.__version__):
        check_transformers(version)
