import dataclasses
import json
import os

import pytest

from plelab.config import (
    PRESETS,
    RunConfig,
    all_keys,
    apply_overrides,
    as_override,
    config_file_overrides,
    get_preset,
    parse_numbers,
    resolve_config,
    resolve_run_config,
)
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


# ---- key lists from field tags, Literal choices declared once -------------------------------------------------

def test_tagged_key_lists_equal_the_lists_kept_by_hand_before():
    from plelab.config import VisualConfig, keys_tagged

    # plelab/training/trainer.py's _RESUME_KEYS as it was written by hand, and train.precision (issue 17: a resume
    # keeps the precision its run resolved)
    # and the kind of run (issue 55: RunConfig.kind, before it visual.enabled inside the visual section)
    assert keys_tagged("resume") == ("kind", "seed", "model", "ple", "train.batch_size", "train.seq_len",
                                     "train.table_optimizer", "train.precision", "aux", "visual")
    # plelab/stats/advise.py's _MATCH as it was written by hand (model: every key), the data keys of issue 18 and
    # data.embedded (issue 25: which embedded corpus is another corpus)
    match = [("model", None), ("ple", ("vocab_size", "vocab_remap", "gate", "gate_init", "gate_learn", "table_init_std",
                                       "ids", "table", "table_scale", "table_scale_dim")),
             ("train", ("steps", "batch_size", "seq_len", "lr", "table_lr", "table_lr_mult", "weight_decay",
                        "table_weight_decay", "warmup_steps", "min_lr_ratio")),
             ("data", ("path", "embedded", "mix", "tokenizer", "val_fraction", "tokenizer_sample_chars", "val_shard",
                      "ood")),
             ("aux", ("kind", "init", "ids", "layers", "gate_channels", "orders", "heads", "rows", "rows_multiple", "dim",
                      "hash_seed"))]  # issue 56: the table family's kind and sizes
    assert keys_tagged("advise") == ("kind",) + tuple(s if keys is None else f"{s}.{k}" for s, keys in match for k in keys or [s])
    # plelab/sweeps/runner.py's data_key: all of data, model.vocab_size, visual minus table / injection / loss_weight
    visual = [f"visual.{f.name}" for f in dataclasses.fields(VisualConfig)
              if f.name not in ("table", "injection", "loss_weight")]
    assert keys_tagged("sweep_data") == ("kind", "model.vocab_size", "data", *visual)
    # plelab/visual/data.py's ids_key: ids and k, and for quantizers online, quantizer_lr, quantizer_batch
    assert keys_tagged("visual_ids") == ("visual.ids", "visual.k")
    assert keys_tagged("quantizer_ids") == ("visual.online", "visual.quantizer_lr", "visual.quantizer_batch")
    with pytest.raises(ValueError, match="no config field is tagged 'resum'"):
        keys_tagged("resum")


def test_choices_are_the_literal_types():
    from plelab.config import GATE_KINDS, QUANTIZER_IDS, VISUAL_IDS

    assert GATE_KINDS == ("gemma", "scalar", "vector", "none")
    assert VISUAL_IDS == ("none", "dct-kmeans", "siglip-kmeans", "random", "oracle", "vq", "lfq", "bsq")
    assert QUANTIZER_IDS == ("vq", "lfq", "bsq")
    cfg = get_preset("cpu-tiny")
    cfg.visual.ids = "magic"  # set directly (no override parsing): validate names the choices
    with pytest.raises(ConfigError, match=r"visual.ids='magic': allowed none \| dct-kmeans \| .* \| bsq$"):
        cfg.validate()


# ---- one config path: base, config file, --set, flags, one validation ------------------------------------------

def test_settings_are_validated_after_every_override():
    """The bug: plelab train set data.* from its flags after validating; now every value is validated once, last."""
    with pytest.raises(ConfigError, match=r"invalid config value data.text_field='': allowed a non-empty field name"):
        resolve_run_config("cpu-tiny", settings={"data.text_field": ""})
    cfg = resolve_run_config("cpu-tiny", overrides=["ple.dim=8"], settings={"ple.dim": 4, "data.path": "x.txt",
                                                                           "seed": None})
    assert (cfg.ple.dim, cfg.data.path, cfg.seed) == (4, os.path.abspath("x.txt"), 0)  # flags win over --set;
    # None = not given; paths made absolute (issue 53.7)


def test_a_runs_config_json_is_accepted_back_as_a_config_file(tmp_path):
    cfg = resolve_config("cpu-small", ["train.lr=0.001", "data.path=my notes.txt"], dp=8, seed=3)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg.to_dict(), indent=2))
    assert resolve_run_config(config=path) == cfg
    assert resolve_run_config("cpu-small", config=path) == cfg  # --preset that agrees is fine
    again = resolve_run_config(config=path, overrides=["train.lr=0.002"], settings={"ple.dim": 16})
    assert (again.train.lr, again.ple.dim, again.seed) == (0.002, 16, 3)  # --set, then flags, on top


def test_a_toml_file_is_any_subset_of_the_keys_on_its_preset(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text('preset = "cpu-small"\nseed = 2\n\n[ple]\ndim = 32\ngate = "scalar"\n\n[train]\nlr = 1e-3\n')
    cfg = resolve_run_config(config=path)
    assert cfg == resolve_config("cpu-small", ["ple.gate=scalar", "train.lr=0.001"], dp=32, seed=2)
    path.write_text("[model]\nhidden_size = 128\n")  # no preset named: --preset (or the default) is the base
    assert resolve_run_config("cpu-sweep", config=path) == resolve_config("cpu-sweep", ["model.hidden_size=128"])
    assert resolve_run_config(config=path).preset == "cpu-tiny"


def test_preset_and_config_file_must_agree(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('preset = "cpu-small"\n')
    with pytest.raises(ConfigError, match="--preset cpu-tiny disagrees with config file .*c.toml, which names preset "
                                          "'cpu-small'"):
        resolve_run_config("cpu-tiny", config=path)
    saved = tmp_path / "config.json"
    saved.write_text(json.dumps(get_preset("cpu-tiny").to_dict()))
    with pytest.raises(ConfigError, match="names preset 'cpu-small', but the run was made from 'cpu-tiny'"):
        resolve_run_config(saved=saved, config=path)
    with pytest.raises(ConfigError, match="--preset cpu-small differs from the run's preset cpu-tiny"):
        resolve_run_config("cpu-small", saved=saved)


@pytest.mark.parametrize("name, content, needle", [
    ("missing.toml", None, "config file {p} does not exist"),
    ("folder.json", "dir", "config file {p} is a folder"),
    ("c.yaml", "preset: cpu-tiny\n", "config file {p} is neither .json nor .toml"),
    ("bad.json", '{"model": {"hidden_size": 64,}}', "config file {p} is not valid JSON: Expecting property name "
                                                     "enclosed in double quotes (at line 1, column 30)"),
    ("bad.toml", 'preset = "cpu-tiny"\n[model\n', "config file {p} is not valid TOML: Expected ']' at the end of a "
                                                   "table declaration (at line 2, column 7)"),
    ("latin1.toml", b'preset = "caf\xe9"\n', "config file {p} is not UTF-8 (invalid byte at offset 13)"),
    ("list.json", "[1, 2]", "config file {p} holds a list, not an object"),
    ("key.toml", "[model]\nbogus = 1\n", "config file {p}: unknown config key 'model.bogus'"),
    ("type.json", '{"model": {"hidden_size": "64"}}', "config file {p}: invalid config value model.hidden_size='64': "
                                                      "allowed int"),
    ("section.toml", "model = 3\n", "config file {p}: config section 'model' must be an object"),
    ("preset.toml", 'preset = "cpu-huge"\n', "config file {p}: unknown preset 'cpu-huge'"),
    ("heads.toml", "[model]\nnum_attention_heads = 3\n", "model.num_attention_heads=3: allowed a divisor"),
])
def test_config_file_errors_are_one_line(tmp_path, name, content, needle):
    path = tmp_path / name
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as info:
        resolve_run_config(config=path)
    assert needle.format(p=path) in str(info.value) and "\n" not in str(info.value)


def test_a_config_file_as_a_sweeps_overrides_reads_back_exactly(tmp_path):
    cfg = resolve_config("cpu-small", ["train.lr=0.0003", "data.path=my notes.txt", "ple.table_scale_dim=none",
                                       "model.tie_word_embeddings=false"], dp=8)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg.to_dict()))
    preset, overrides = config_file_overrides(path)
    assert preset == "cpu-small" and "train.lr=0.0003" in overrides and "ple.dim=8" in overrides
    assert not any(o.startswith("model.hidden_size=") for o in overrides)  # only what differs from the preset
    assert resolve_config(preset, overrides) == cfg
    with pytest.raises(ConfigError, match="cannot be written as an override"):  # --set strips the space
        as_override(RunConfig.from_dict({"data": {"path": " x"}}), "data.path")


def test_one_number_list_parser():
    assert parse_numbers("0, 64,128", "--dp") == [0, 64, 128]
    assert parse_numbers("64", "--dp", one=True) == 64
    assert parse_numbers("0.1,1", "--lambdas", item=float) == [0.1, 1.0]
    with pytest.raises(ConfigError, match=r"^invalid --dp '0,x': give integers separated by commas, e\.g\. --dp "):
        parse_numbers("0,x", "--dp")
    with pytest.raises(ConfigError, match=r"^invalid --dp '0,8': give one integer, e\.g\. --dp 64 \(note\)$"):
        parse_numbers("0,8", "--dp", one=True, example="64", note="note")
    with pytest.raises(ConfigError, match="invalid --seed-list ''"):
        parse_numbers("", "--seed-list")
