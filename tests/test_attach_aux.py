"""plelab.attach_table on HF decoders: the value / ngram / modulation tables of the family attached by hooks to tiny
random Llama and Qwen3 models built locally (nothing downloaded) — a start equal to the host, exact cached
decoding, training, the round trip through save_pretrained, parameter groups, and the refusals."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from hf_models import tiny_host

import plelab
from plelab.errors import PlelabError
from plelab.integrations.hf import ATTACHED_TYPE
from plelab.integrations.hf_aux import KINDS, TABLE_CONFIG_KEY, attach_table, load_attached_table

V, H, L = 256, 64, 2
FAMILIES = ("llama", "qwen3")
ROOTS = {"value": "model.value_embeddings.", "ngram": "model.ngram_embedding.", "modulation": "model.token_modulation."}


def host(family: str = "llama"):
    common = dict(vocab_size=V, hidden_size=H, intermediate_size=128, num_hidden_layers=L, num_attention_heads=4,
                  num_key_value_heads=2)
    config = (transformers.LlamaConfig(**common) if family == "llama"
              else transformers.Qwen3Config(head_dim=16, **common))
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def ids(seed: int = 0, b: int = 2, t: int = 10) -> torch.Tensor:
    return torch.randint(0, V, (b, t), generator=torch.Generator().manual_seed(seed))


def table_params(model, kind: str) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if n.startswith(ROOTS[kind])}


@torch.no_grad()
def live(model, kind: str):
    """A trained-looking table: every tensor of it random (the function-preserving start's zeros made non-zero)."""
    for name, p in table_params(model, kind).items():
        p.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(len(name)))
    return model


def generate(model, prompt, **kwargs):
    return model.generate(prompt, max_new_tokens=5, do_sample=False, attention_mask=torch.ones_like(prompt),
                          pad_token_id=0, **kwargs)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", KINDS)
def test_the_start_is_the_host_then_the_table_acts_and_cached_decoding_is_exact(family, kind):
    model, x = host(family), ids()
    with torch.no_grad():
        before = model(x).logits
    rng = torch.random.get_rng_state()
    assert attach_table(model, kind) is model
    assert torch.equal(rng, torch.random.get_rng_state())  # the user's global RNG is left alone
    with torch.no_grad():
        assert torch.equal(model(x).logits, before)  # function-preserving: exactly the host
    names = set(table_params(model, kind))
    expected = {"value": {"model.value_embeddings.embed.weight", "model.value_embeddings.gates.1.weight"},
                "ngram": {"model.ngram_embedding.embed.weight", "model.ngram_embedding.proj.weight",
                          "model.ngram_embedding.lambdas"},
                "modulation": {"model.token_modulation.embed.weight"}}[kind]
    assert names == expected  # plelab's own decoder's names (nanochat's rule picks layer 1 of 2)
    live(model, kind)
    with torch.no_grad():
        full = model(x).logits
        assert (full - before).abs().max() > 1e-3
        out = model(x[:, :4], use_cache=True)  # the cache the base model makes, then fed back step by step
        steps = [out.logits] + [model(x[:, t:t + 1], past_key_values=out.past_key_values, use_cache=True).logits
                                for t in range(4, x.shape[1])]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)
    prompt = x[:, :4]
    assert torch.equal(generate(model, prompt, use_cache=True), generate(model, prompt, use_cache=False))
    if kind == "ngram" and family == "llama":  # beam search reorders the cache: the kept n-gram tokens follow
        assert torch.equal(generate(model, prompt, use_cache=True, num_beams=2),
                           generate(model, prompt, use_cache=False, num_beams=2))
    assert model.base_model.plelab_table_attachment.frames.stack == []


@pytest.mark.parametrize("kind", KINDS)
def test_training_reaches_every_table_tensor_and_param_groups_hold_the_tables(kind):
    model = attach_table(host("qwen3" if kind == "ngram" else "llama"), kind, freeze_host=True).train()
    params = table_params(model, kind)
    groups = {g["name"]: g for g in plelab.param_groups(model, lr=1e-2, table_lr=5e-3)}
    tables = {n for n, p in params.items() if any(p is q for q in groups["aux_table"]["params"])}
    assert tables == {n for n in params if ".embed" in n} and groups["aux_table"]["lr"] == 5e-3
    trained = {id(p) for g in groups.values() for p in g["params"]}
    assert trained == {id(p) for p in params.values()}  # freeze_host: only the table trains
    opt = plelab.adamw(list(groups.values()))
    start = {n: p.detach().clone() for n, p in params.items()}
    got = dict.fromkeys(params, False)
    x = ids(10, b=4)
    for _ in range(2):  # a zero factor at the start: some tensors get their first gradient at step 2
        model(x, labels=x).loss.backward()
        for n, p in params.items():
            got[n] |= p.grad is not None and bool(p.grad.abs().sum() > 0)
        opt.step()
        opt.zero_grad()
    assert all(got.values()), got
    assert all(not torch.equal(start[n], p) for n, p in params.items())


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", KINDS)
def test_save_pretrained_round_trip(tmp_path, family, kind):
    sizes = {"value": {"layers": [0, 1], "gate_channels": 8}, "ngram": {"orders": [2], "heads": 2, "rows": 101},
             "modulation": {"layers": [1]}}[kind]
    model = live(attach_table(host(family), kind, seed=4, **sizes), kind)
    x = ids(3)
    with torch.no_grad():
        want = model(x).logits
    model.save_pretrained(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["model_type"] == ATTACHED_TYPE and config[TABLE_CONFIG_KEY]["host_model_type"] == family
    assert config[TABLE_CONFIG_KEY]["kind"] == kind and config[TABLE_CONFIG_KEY]["seed"] == 4
    loaded = plelab.load_attached(tmp_path / "m").eval()
    with torch.no_grad():
        assert torch.equal(loaded(x).logits, want)
    assert set(table_params(loaded, kind)) == set(table_params(model, kind))
    if (family, kind) == ("llama", "value"):  # plain transformers loads it with the table (plelab imported)
        plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()
        with torch.no_grad():
            assert torch.equal(plain(x).logits, want)
        plain.save_pretrained(tmp_path / "again")
        assert torch.equal(load_attached_table(tmp_path / "again").eval()(x).logits, want)


def test_native_inits_are_seeded_and_leave_the_global_rng_alone():
    for kind, name in (("value", "nanochat"), ("ngram", "modded"), ("modulation", "normal")):
        a, b, c = (attach_table(host(), kind, init=init, seed=seed)
                   for init, seed in (("native", 0), (name, 0), ("native", 1)))
        pa, pb, pc = (list(table_params(m, kind).values()) for m in (a, b, c))
        assert all(torch.equal(p, q) for p, q in zip(pa, pb))
        assert a.config.to_dict()[TABLE_CONFIG_KEY]["init"] == name
        assert kind == "ngram" or not all(torch.equal(p, q) for p, q in zip(pa, pc))
    value = table_params(attach_table(host(), "value", init="native"), "value")[ROOTS["value"] + "embed.weight"]
    assert 0.9 * 3 ** 0.5 * H ** -0.5 < value.abs().max() <= 3 ** 0.5 * H ** -0.5  # nanochat: uniform ±√3·H^-½


def test_nothing_outlives_the_forward_and_inputs_embeds_alone_are_refused():
    model = attach_table(host(), "modulation")
    frames = model.base_model.plelab_table_attachment.frames
    with pytest.raises(PlelabError, match="needs input_ids") as err:
        model(inputs_embeds=torch.randn(2, 5, H))
    assert "\n" not in str(err.value) and frames.stack == []
    with pytest.raises(Exception):
        model(ids(), attention_mask=torch.ones(3, 3, 3, 3, 3))  # a broken mask: the host's forward raises
    assert frames.stack == []


def test_a_cache_the_table_did_not_leave_as_it_was_is_refused():
    model = live(attach_table(host(), "ngram"), "ngram")
    x = ids()
    with torch.no_grad():
        cache = model(x[:, :6], use_cache=True).past_key_values
        cache.crop(-2)  # as assisted decoding does: the kept n-gram tokens no longer end where the cache does
        with pytest.raises(PlelabError, match="cropped"):
            model(x[:, 4:5], past_key_values=cache)
        foreign = host()(x[:, :6], use_cache=True).past_key_values  # filled by a model without the table
        with pytest.raises(PlelabError, match="filled elsewhere"):
            model(x[:, 6:7], past_key_values=foreign)


def test_gradient_checkpointing_is_refused_in_one_line():
    model = attach_table(host(), "value")
    model.gradient_checkpointing_enable()
    model.train()
    with pytest.raises(PlelabError, match="gradient checkpointing .* gradient_accumulation_steps") as err:
        model(ids(), labels=ids())
    assert "\n" not in str(err.value)


def test_one_table_per_model():
    model = attach_table(host(), "value")
    for again in (lambda: attach_table(model, "ngram"), lambda: plelab.attach(model, 8)):
        with pytest.raises(PlelabError, match="attached already"):
            again()
    with pytest.raises(PlelabError, match="has PLE attached already"):
        attach_table(plelab.attach(host(), 8), "modulation")


BAD = {
    "unknown kind": (dict(kind="ple"), "unknown table kind 'ple'"),
    "unknown init": (dict(kind="value", init="gemma"), "unknown value table init 'gemma'"),
    "another kind's size": (dict(kind="value", orders=[2]), "takes layers, gate_channels, not orders"),
    "modulation takes layers only": (dict(kind="modulation", dim=4), "takes layers, not dim"),
    "a modulated layer out of range": (dict(kind="modulation", layers=[0, 2]), "from 0 to 1"),
    "layer out of range": (dict(kind="value", layers=[2]), "from 0 to 1"),
    "repeated layers": (dict(kind="value", layers=[1, 1]), "distinct integers"),
    "gate wider than H": (dict(kind="value", gate_channels=H + 1), f"from 1 to {H}"),
    "order 1": (dict(kind="ngram", orders=[1, 2]), ">= 2"),
    "rows a multiple of V": (dict(kind="ngram", rows=2 * V), "multiple of the vocabulary"),
    "zero heads": (dict(kind="ngram", heads=0), "heads must be an integer >= 1"),
    "a bool dim": (dict(kind="ngram", dim=True), "dim must be an integer"),
    "orders not a list": (dict(kind="ngram", orders="23"), "list of distinct integers"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_arguments_are_one_line(case):
    kwargs, needle = BAD[case]
    model = host()
    with pytest.raises(PlelabError) as err:
        attach_table(model, **kwargs)
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert not hasattr(model.base_model, "plelab_table_attachment")  # a refusal leaves the model as it was


def test_layouts_that_cannot_carry_a_table_are_refused():
    with pytest.raises(PlelabError, match="separate value projection .* choose 'ngram' or 'modulation'"):
        attach_table(tiny_host("gpt_neox"), "value")
    with pytest.raises(PlelabError, match="plelab.attach_table does not support model_type 'gpt2'"):
        attach_table(transformers.AutoModelForCausalLM.from_config(transformers.GPT2Config(
            vocab_size=V, n_embd=32, n_layer=2, n_head=4)), "ngram")
    with pytest.raises(PlelabError, match="plelab.attach_table takes an HF transformers causal LM"):
        attach_table(torch.nn.Linear(4, 4), "ngram")


def test_load_attached_table_refuses_a_plain_folder(tmp_path):
    host().save_pretrained(tmp_path)
    with pytest.raises(PlelabError, match="not saved from a model with plelab.attach_table"):
        load_attached_table(tmp_path)
