"""Messages that say what was meant: the closest config key, the fields a JSONL line does hold, a refit refused
where it would rewrite an installed package."""

import importlib.util
import json

import pytest

from plelab.config import resolve_config
from plelab.data.sources import user_corpus
from plelab.errors import ConfigError, PlelabError


@pytest.mark.parametrize("given, meant", [("model.hiden_size=3", "model.hidden_size"), ("ple.dims=3", "ple.dim"),
                                          ("hidden_size=64", "model.hidden_size"), ("train.step=5", "train.steps")])
def test_an_unknown_key_names_the_closest(given, meant):
    with pytest.raises(ConfigError, match=f"did you mean '{meant}'"):
        resolve_config("cpu-tiny", [given])


def test_nothing_close_suggests_nothing():
    with pytest.raises(ConfigError) as err:
        resolve_config("cpu-tiny", ["model.banana=3"])
    assert "did you mean" not in str(err.value)


def test_a_jsonl_line_without_the_text_field_lists_its_fields(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text(json.dumps({"body": "text", "id": 3}) + "\n")
    with pytest.raises(PlelabError, match=r"has no field 'text' \(its fields: 'body', 'id'\)"):
        list(user_corpus(path, "text").documents)


def test_write_thresholds_refuses_an_installed_package(tmp_path, monkeypatch):
    import plelab.calibration.commands as C

    monkeypatch.setattr(C, "shipped_is_source", lambda: False)
    with pytest.raises(ConfigError, match="not a file of a plelab source checkout"):
        C.calibrate(tmp_path / "c", write_thresholds=True)
    assert not (tmp_path / "c").exists()


def test_params_refuses_a_seed_it_would_ignore(capsys):
    from plelab.cli import main

    try:
        rc = main(["params", "--preset", "cpu-tiny", "--seed", "3"])
    except SystemExit as exit_:
        rc = exit_.code
    assert rc == 2 and "unrecognized arguments: --seed 3" in capsys.readouterr().err
    assert main(["params", "--preset", "cpu-tiny", "--dp", "0,8"]) == 0


@pytest.mark.parametrize("make", ["text", "tokens"])
def test_text_field_without_fields_to_read_is_refused(tmp_path, capsys, make):
    from plelab.cli import main

    if make == "text":
        data = tmp_path / "notes"
        data.mkdir()
        (data / "a.txt").write_text("one paragraph\n\nanother one\n" * 200)
    else:
        data = tmp_path / "train.bin"
        data.write_bytes(bytes(4000))
    out = tmp_path / "run"
    code = main(["train", "--data", str(data), "--text-field", "body", "--set", "data.token_dtype=uint16",
                 "--out", str(out), "--steps", "2", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "data.text_field='body' names a JSONL field" in err and "Traceback" not in err
    assert not out.exists()  # refused before any data step or folder


def test_a_seed_beyond_a_torch_generator_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"seed=1234567890123456789012345678901: allowed an integer from 0 to 2"):
        resolve_config("cpu-tiny", seed=1234567890123456789012345678901)
    assert resolve_config("cpu-tiny", seed=2 ** 63 - 1).seed == 2 ** 63 - 1


def test_a_json_config_that_sets_a_key_twice_is_refused(tmp_path):
    path = tmp_path / "dup.json"
    path.write_text('{"train": {"steps": 3, "steps": 4}}')
    with pytest.raises(ConfigError, match="sets 'steps' twice"):
        resolve_config(None, config=path)


def test_mixture_weights_whose_sum_overflows_are_refused():
    from plelab.data.mixture import parse_mixture

    with pytest.raises(ConfigError, match=r"sum to inf; they are relative"):
        parse_mixture(["a.jsonl:1e308", "b.jsonl:1e308"])


def test_an_unknown_device_and_a_nan_temperature_are_one_line(tmp_path, capsys):
    from plelab.cli import main
    from plelab.runtime import resolve_device

    with pytest.raises(ConfigError, match="invalid device 'banana'"):
        resolve_device("banana")
    from plelab.model.generate import check_sampling

    with pytest.raises(ValueError, match="finite number >= 0"):
        check_sampling(4, float("nan"), None)
    assert main(["eval", str(tmp_path), "--device", "banana"]) == 2  # refused before the folder is read
    err = capsys.readouterr().err
    assert "invalid device 'banana'" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("name, text, needle", [
    ("deep.json", '{"a":' * 20000 + "1" + "}" * 20000, "nests deeper than any config"),
    ("deep.toml", "a = " + "[" * 20000 + "]" * 20000, "nests deeper than any config"),
    ("big.json", '{"seed": ' + "9" * 5000 + "}", "holds a value plelab cannot read"),
    ("big.toml", "seed = " + "9" * 5000, "holds a value plelab cannot read"),
])
def test_deep_or_huge_config_files_are_one_line(tmp_path, name, text, needle):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        resolve_config(None, config=path)


def test_what_refuses_a_run_refuses_it_before_the_data_step(tmp_path, monkeypatch):
    import plelab.runs
    from plelab.locks import FolderLock

    def data_step(*args, **kwargs):
        raise AssertionError("the data step ran before the refusal")

    monkeypatch.setattr(plelab.runs, "prepare_data", data_step)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    cfg = resolve_config("cpu-tiny", steps=2)
    with pytest.raises(PlelabError, match="already holds a run"):
        plelab.runs.train(cfg, run, progress=False)
    if importlib.util.find_spec("tensorboard") is None:  # CI's environment has none
        tb = resolve_config("cpu-tiny", ["train.tensorboard=true"], steps=2)
        with pytest.raises(PlelabError, match="needs the tensorboard package"):
            plelab.runs.train(tb, tmp_path / "tb", progress=False)
    held = FolderLock.acquire(run)  # another process writing the folder (this one, as far as flock goes: a new fd)
    try:
        with pytest.raises(PlelabError, match="is in use by another plelab process"):
            plelab.runs.train(cfg, run, resume=True, progress=False)
    finally:
        held.release()


def test_mixture_weights_the_slot_pattern_cannot_realise_are_refused():
    from plelab.data.mixture import parse_mixture

    with pytest.raises(ConfigError, match=r"has weight 1e-09 of the mix; weights are realised in steps of 0.001"):
        parse_mixture(["a.jsonl:1", "b.jsonl:1e-9"])
    with pytest.raises(ConfigError, match="a mixture of 1,001 sources"):
        parse_mixture([f"s{i}.jsonl:1" for i in range(1001)])
    assert [w for _, w in parse_mixture(["a.jsonl:999", "b.jsonl:1"])] == [0.999, 0.001]


def test_a_sweep_past_the_runs_one_folder_holds_is_refused_before_anything_runs(tmp_path):
    from plelab.sweeps.commands import sweep

    with pytest.raises(PlelabError, match=r"a sweep of 200,000 runs \(2 arms × 100,000 seeds\): one sweep folder"):
        sweep(tmp_path / "huge", preset="cpu-tiny", dp=[0, 8], seeds=100_000, progress=False)
    assert not (tmp_path / "huge").exists()
    spec = tmp_path / "edited" / "sweep.json"
    spec.parent.mkdir()
    sweep(tmp_path / "edited", preset="cpu-tiny", dp=[0, 8], seeds=1, steps=1, emit="torchrun")
    saved = json.loads(spec.read_text())
    saved["seeds"] = list(range(60_000))
    spec.write_text(json.dumps(saved))
    with pytest.raises(PlelabError, match="is not a valid plelab sweep .*one sweep folder holds at most 100,000"):
        sweep(tmp_path / "edited", preset="cpu-tiny", dp=[0, 8], seeds=1, steps=1, emit="torchrun")


@pytest.mark.parametrize("args, needle", [
    (["--dp", "0", "--table-optimizer", "row-sparse"], "train.table_optimizer='row-sparse' sets the per-layer table"),
    (["--dp", "0", "--set", "ple.table_scale=2"], "ple.table_scale=2.0 sets the per-layer table, but ple.dim=0"),
    (["--dp", "0", "--set", "ple.vocab_size=100"], "ple.vocab_size=100 sets the per-layer table"),
    (["--set", "ple.gate_init=0.5"], "ple.gate_init=0.5 sets a learned gate, but ple.gate=gemma has none"),
    (["--tokenizer", "tok.json", "--set", "data.tokenizer_sample_chars=5000"], "--tokenizer gives the tokenizer"),
])
def test_a_setting_a_run_would_record_and_not_use_is_refused(tmp_path, capsys, args, needle):
    from plelab.cli import main

    out = tmp_path / "run"
    assert main(["train", "--preset", "cpu-tiny", *args, "--out", str(out), "--steps", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and not out.exists()


@pytest.mark.parametrize("layers", [2.0, [2], "2", 0])
def test_a_foreign_config_with_a_non_integer_layer_count_is_one_line(tmp_path, layers):
    import torch
    from safetensors.torch import save_file

    from plelab.diagnostics.tables import find_table

    save_file({"model.embed_tokens_per_layer.weight": torch.randn(64, 16)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma3n_text", "num_hidden_layers": layers,
                                                      "hidden_size_per_layer_input": 8}))
    with pytest.raises(PlelabError, match=r"says num_hidden_layers = .*not a positive integer; fix it or pass"):
        find_table(tmp_path)
    assert find_table(tmp_path, num_layers=2, dp=8).num_layers == 2  # the flags, as the message says


def test_export_of_a_run_whose_tokenizer_is_garbage_is_one_line_and_writes_nothing(tmp_path, capsys):
    from plelab.cli import main

    run = tmp_path / "run"
    assert main(["train", "--preset", "cpu-tiny", "--steps", "1", "--out", str(run), "--no-progress"]) == 0
    (run / "tokenizer.json").write_text("garbage{")
    capsys.readouterr()
    assert main(["export", str(run), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert "cannot load tokenizer" in err and "Traceback" not in err and not (tmp_path / "hf").exists()


@pytest.mark.parametrize("state, why", [
    ({"format": "plelab-1", "files": ["model.safetensors"]}, "files is not a map of file name to byte count"),
    ({"files": {}}, "names no format"),
    ({"format": "plelab-1"}, "missing or unreadable"),
])
def test_a_sharded_manifest_of_the_wrong_shape_is_a_reason_not_a_traceback(tmp_path, state, why):
    from plelab.training.sharded_checkpoint import torn_reason

    (tmp_path / "state.json").write_text(json.dumps(state))
    assert why in torn_reason(tmp_path)


def test_a_jsonl_file_that_starts_with_a_byte_order_mark_reads_as_its_text(tmp_path):
    from plelab.data.jsonl import jsonl_documents

    path = tmp_path / "bom.jsonl"
    lines = [json.dumps({"text": "first"}).encode(), json.dumps({"text": "second"}).encode()]
    path.write_bytes(b"\xef\xbb\xbf" + b"\n".join(lines))
    assert list(jsonl_documents(path, "text")) == ["first", "second"]


def test_a_config_file_that_starts_with_a_byte_order_mark_reads_as_its_text(tmp_path):
    from plelab.config import read_config_file

    for name, text in (("c.toml", '[ple]\ndim = 8\n'), ("c.json", '{"ple": {"dim": 8}}')):
        (tmp_path / name).write_bytes(b"\xef\xbb\xbf" + text.encode())
        assert read_config_file(tmp_path / name)["ple"]["dim"] == 8, name


def test_consolidate_refuses_shards_that_are_not_the_runs_model(tmp_path):
    from types import SimpleNamespace

    import torch

    from plelab.model.init import build_model
    from plelab.training.sharded_checkpoint import _check_against_the_run

    cfg = resolve_config("cpu-tiny")
    (tmp_path / "state.json").write_text(json.dumps({"config": cfg.to_dict()}))
    model = build_model(cfg.model, cfg.ple, device="meta")
    meta = {n: SimpleNamespace(properties=SimpleNamespace(dtype=t.dtype), size=torch.Size(t.shape))
            for n, t in model.state_dict().items()}
    _check_against_the_run(tmp_path, meta)  # the run's own tensors pass
    meta["model.embed_tokens.weight"].properties.dtype = torch.int32
    with pytest.raises(PlelabError, match="model.embed_tokens.weight is stored as int32"):
        _check_against_the_run(tmp_path, meta)
    meta["model.embed_tokens.weight"].properties.dtype = torch.float32
    meta["model.embed_tokens.weight"].size = torch.Size([256, 64])
    with pytest.raises(PlelabError, match="model.embed_tokens.weight"):
        _check_against_the_run(tmp_path, meta)


def test_a_device_given_as_data_is_called_a_device():
    from plelab.data.sources import resolve_source

    with pytest.raises(PlelabError, match="data path /dev/null is a device, pipe or socket, not a file or folder"):
        resolve_source("/dev/null")


@pytest.mark.parametrize("corpus, needle", [("empty.txt", "holds no text"),
                                           ("notes.csv", "is not a format plelab reads")])
def test_calibrate_refuses_an_unreadable_corpus_before_any_run_trains(tmp_path, monkeypatch, corpus, needle):
    """Issue 54 (misleading): an empty --corpus was refused after 54 s of training the embedded corpus's regimes;
    every regime's data is now prepared first, the user's corpora before the embedded one."""
    import plelab.calibration.benchmark as benchmark
    from plelab.calibration.commands import calibrate

    monkeypatch.setattr(benchmark, "run_sweep", lambda *a, **k: pytest.fail("a regime trained before every corpus "
                                                                            "was read"))
    (tmp_path / corpus).write_text("" if corpus == "empty.txt" else "a,b\n1,2\n")
    with pytest.raises(PlelabError, match=needle):
        calibrate(tmp_path / "bench", quick=True, corpora={"mine": str(tmp_path / corpus)}, progress=False)


def test_fit_names_every_run_it_skips(tmp_path):
    """Issue 54 (silent): plelab fit printed 'RMS residual nan' from a "NaN" loss string and skipped unreadable
    summaries without naming them; each skipped run is named with its reason."""
    from plelab.scaling.scaling_runs import points_from_runs

    config = resolve_config("cpu-tiny", ["ple.dim=0"]).to_dict()
    for name, summary in (("good", {"config": config, "final_val_loss": 5.0, "tokens_seen": 1000}),
                          ("nan", {"config": config, "final_val_loss": "NaN", "tokens_seen": 1000}),
                          ("garbage", None)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text("{garbage" if summary is None else json.dumps(summary))
    points, notes = points_from_runs([tmp_path])
    assert [p.loss for p in points] == [5.0]
    assert any(n.startswith(f"skipped {tmp_path / 'garbage'}: its summary is not a finished plelab run") for n in notes)
    assert any(n.startswith(f"skipped {tmp_path / 'nan'}: its final loss nan") for n in notes)
