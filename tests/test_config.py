import json

import pytest

from plelab.config import PRESETS, RunConfig, all_keys, apply_overrides, get_preset, resolve_config
from plelab.errors import ConfigError


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_validates_and_round_trips_through_json(name):
    cfg = get_preset(name).validate()
    assert cfg.preset == name
    again = RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg


def test_seed_3b_preset_is_the_seed_model():
    m = get_preset("seed-3b").model
    assert (m.hidden_size, m.num_hidden_layers, m.num_attention_heads, m.num_key_value_heads) == (2560, 32, 20, 4)
    assert (m.resolved_head_dim, m.intermediate_size, m.vocab_size, m.tie_word_embeddings) == (128, 6912, 100_096, True)


def test_overrides_are_typed_and_shortcuts_apply():
    cfg = resolve_config("cpu-tiny", ["model.hidden_size=128", "ple.vocab_size=none", "model.tie_word_embeddings=false",
                                      "train.lr=1e-3", "ple.gate=vector"], dp=32, seed=7)
    assert cfg.model.hidden_size == 128 and cfg.ple.vocab_size is None
    assert cfg.model.tie_word_embeddings is False and cfg.train.lr == 1e-3
    assert cfg.ple.dim == 32 and cfg.ple.gate == "vector" and cfg.seed == 7


@pytest.mark.parametrize("overrides, dp, needle", [
    ([], -1, "ple.dim=-1"),
    (["model.num_attention_heads=3"], None, "model.num_attention_heads=3: allowed a divisor of model.hidden_size=64"),
    (["model.num_key_value_heads=3"], None, "a divisor of model.num_attention_heads=4"),
    (["model.vocab_size=1"], None, "model.vocab_size=1: allowed an integer >= 2"),
    (["ple.gate=sigmoid"], None, "allowed gemma | scalar | vector | none"),
    (["model.hidden_size=wide"], None, "model.hidden_size='wide': allowed int"),
    (["model.hidden_sise=64"], None, "unknown config key 'model.hidden_sise'"),
    (["optimizer.lr=1"], None, "unknown config key 'optimizer.lr'"),
    (["model.hidden_size"], None, "is not of the form section.key=value"),
    (["train.lr=0"], None, "train.lr=0.0: allowed a number > 0"),
    (["model.tie_word_embeddings=maybe"], None, "allowed bool"),
])
def test_invalid_values_give_one_line_errors_naming_the_field(overrides, dp, needle):
    with pytest.raises(ConfigError) as info:
        resolve_config("cpu-tiny", overrides, dp=dp)
    msg = str(info.value)
    assert needle in msg and "\n" not in msg


def test_unknown_preset_lists_the_choices():
    with pytest.raises(ConfigError, match="unknown preset 'cpu-huge': choose one of cpu-tiny, cpu-small"):
        get_preset("cpu-huge")


def test_from_dict_rejects_unknown_keys_and_wrong_types():
    d = get_preset("cpu-tiny").to_dict()
    d["model"]["layers"] = 3
    with pytest.raises(ConfigError, match="unknown config key 'model.layers'"):
        RunConfig.from_dict(d)
    d = get_preset("cpu-tiny").to_dict()
    d["model"]["hidden_size"] = "64"
    with pytest.raises(ConfigError, match="model.hidden_size='64'"):
        RunConfig.from_dict(d)
    with pytest.raises(ConfigError, match="must be an object"):
        RunConfig.from_dict({"model": 3})


def test_all_keys_are_overridable():
    cfg = get_preset("cpu-tiny")
    keys = all_keys(cfg)
    assert "model.hidden_size" in keys and "ple.dim" in keys and "seed" in keys
    # every key accepts its own current value written as text
    for key in keys:
        section, _, attr = key.rpartition(".")
        value = getattr(getattr(cfg, section) if section else cfg, attr)
        apply_overrides(cfg, [f"{key}={'none' if value is None else value}"])
    assert cfg == get_preset("cpu-tiny")
