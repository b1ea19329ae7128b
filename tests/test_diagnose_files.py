"""`plelab diagnose` on an HF Gemma 4 checkpoint saved locally, and clear errors for malformed inputs."""

import pytest
import torch
from safetensors.torch import save_file

import plelab
from plelab.cli import main
from plelab.diagnostics.diagnose import diagnose_run as diagnose

transformers = pytest.importorskip("transformers", minversion="5.5")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    cfg = Gemma4TextConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, hidden_size_per_layer_input=8,
                           vocab_size_per_layer_input=300, layer_types=["full_attention"] * 3)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("hf") / "gemma4-tiny"
    Gemma4ForCausalLM(cfg).save_pretrained(path)
    return path


def test_hf_gemma4_checkpoint_gives_a_w_t_only_report(hf_dir, capsys):
    rep = diagnose(hf_dir, progress=False)
    assert rep["shape"] == [300, 3, 8] and rep["key"].endswith("embed_tokens_per_layer.weight")
    assert rep["table"]["verdict"]["structure"] == "UNDECIDED" and "W_t-only" in rep["notes"][0]
    assert rep["layers"][0]["wt_all"]["erank_raw"] == pytest.approx(rep["layers"][0]["null_all"]["erank_raw"], rel=0.05)
    assert main(["diagnose", str(hf_dir / "model.safetensors"), "--no-progress"]) == 0
    assert "W_t-only report" in capsys.readouterr().out


def test_bare_safetensors_needs_dims_then_streams_in_chunks(tmp_path, monkeypatch, capsys):
    table = torch.randn(1000, 4 * 16)
    save_file({"embed_tokens_per_layer.weight": table}, str(tmp_path / "t.safetensors"))
    assert main(["diagnose", str(tmp_path / "t.safetensors"), "--no-progress"]) == 2
    assert "pass --num-layers and --dp" in capsys.readouterr().err
    import plelab.diagnostics.tables as tables

    whole = diagnose(tmp_path / "t.safetensors", num_layers=4, dp=16, progress=False)  # one chunk
    monkeypatch.setattr(tables, "CHUNK_BYTES", 4 * 64 * 100)  # 100-row chunks
    chunked = diagnose(tmp_path / "t.safetensors", num_layers=4, dp=16, progress=False)
    for a, b in zip(whole["layers"], chunked["layers"]):
        for key, value in a["wt_all"].items():
            assert b["wt_all"][key] == pytest.approx(value, rel=1e-9), key
    assert main(["diagnose", str(tmp_path / "t.safetensors"), "--num-layers", "5", "--dp", "16",
                 "--no-progress"]) == 2
    assert "not [Vp, L·dP]" in capsys.readouterr().err
    with pytest.warns(DeprecationWarning, match="dp="):  # plelab.diagnose's old keyword works for one release
        old = plelab.diagnose(tmp_path / "t.safetensors", num_layers=4, dim=16, progress=False)
    assert old["layers"][0]["wt_all"] == pytest.approx(chunked["layers"][0]["wt_all"], rel=1e-9)
    with pytest.raises(TypeError, match="dp only"):
        plelab.diagnose(tmp_path / "t.safetensors", num_layers=4, dp=16, dim=16, progress=False)


@pytest.mark.parametrize("make, needle", [
    (lambda p: p.write_bytes(b"not a safetensors file at all"), "is not a readable safetensors file"),
    (lambda p: save_file({"other.weight": torch.zeros(3, 3)}, str(p)), "no tensor named '*embed_tokens_per_layer"),
    (lambda p: p.write_bytes(b"\x80\x04\x95pickle"), "is not a readable safetensors file"),
])
def test_malformed_files_give_one_line_errors(tmp_path, capsys, make, needle):
    path = tmp_path / "x.safetensors"
    make(path)
    assert main(["diagnose", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_runs_without_a_table_or_checkpoint(tmp_path, capsys):
    assert main(["train", "--preset", "cpu-tiny", "--dp", "0", "--steps", "2", "--out", str(tmp_path / "base"),
                 "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["diagnose", str(tmp_path / "base"), "--no-progress"]) == 2
    assert "dP=0 run" in capsys.readouterr().err
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    (tmp_path / "empty" / "config.json").write_text("{}")
    assert main(["diagnose", str(tmp_path / "empty"), "--no-progress"]) == 2
    assert "has no checkpoint yet" in capsys.readouterr().err
    assert main(["diagnose", str(tmp_path / "nowhere"), "--no-progress"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_bad_diagnose_arguments(tmp_path, capsys):
    save_file({"embed_tokens_per_layer.weight": torch.randn(50, 8)}, str(tmp_path / "t.safetensors"))
    (tmp_path / "afile").write_text("x")
    assert main(["diagnose", str(tmp_path / "t.safetensors"), "--num-layers", "2", "--dp", "4",
                 "--out", str(tmp_path / "afile"), "--no-progress"]) == 2
    assert "is a file" in capsys.readouterr().err
    assert main(["diagnose", str(tmp_path / "t.safetensors"), "--windows", "0", "--no-progress"]) == 2
    assert "--windows must be >= 1" in capsys.readouterr().err
    assert (tmp_path / "afile").read_text() == "x"
