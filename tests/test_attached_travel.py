"""A folder save_pretrained writes after plelab.attach travels: plain AutoModelForCausalLM.from_pretrained loads it
with PLE (plelab imported), a process without plelab refuses it, and load_attached reads it and older folders."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from hf_models import batch, tiny_host

import plelab
from plelab.integrations.hf import ATTACHED_TYPE


def _attached_with_a_live_branch():
    model = plelab.attach(tiny_host("llama"), 8, seed=3)
    with torch.no_grad():  # the function-preserving start has a zero branch: give it something to carry
        for p in plelab.PLEModules(model).parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)
    return model.eval()


def test_plain_from_pretrained_loads_an_attached_folder_with_ple(tmp_path):
    import transformers

    model = _attached_with_a_live_branch()
    model.save_pretrained(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["model_type"] == ATTACHED_TYPE and config["plelab_ple"]["host_model_type"] == "llama"
    ids = batch(1)
    want = model(ids).logits
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()
    assert plelab.PLEModules(plain).dim == 8
    assert torch.equal(plain(ids).logits, want)
    host_only = tiny_host("llama").eval()
    host_only.load_state_dict({k: v for k, v in model.state_dict().items() if k in host_only.state_dict()})
    assert not torch.allclose(host_only(ids).logits, want)  # the table matters: dropping it would show
    again = plelab.load_attached(tmp_path / "m")  # and it saves as it was loaded
    assert torch.equal(again.eval()(ids).logits, want)
    again.save_pretrained(tmp_path / "m2")
    assert json.loads((tmp_path / "m2" / "config.json").read_text())["model_type"] == ATTACHED_TYPE


@pytest.mark.slow
def test_without_plelab_transformers_refuses_the_folder(tmp_path):
    _attached_with_a_live_branch().save_pretrained(tmp_path / "m")
    code = ("import sys, transformers\n"
            "assert 'plelab' not in sys.modules\n"
            f"transformers.AutoModelForCausalLM.from_pretrained({str(tmp_path / 'm')!r})\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and ATTACHED_TYPE in proc.stderr


def test_load_attached_reads_folders_saved_before_the_attached_type(tmp_path):
    model = _attached_with_a_live_branch()
    model.save_pretrained(tmp_path / "m")
    path = tmp_path / "m" / "config.json"
    config = json.loads(path.read_text())
    config["model_type"] = config["plelab_ple"].pop("host_model_type")  # as attach saved folders before
    path.write_text(json.dumps(config))
    ids = batch(2)
    assert torch.equal(plelab.load_attached(tmp_path / "m").eval()(ids).logits, model(ids).logits)


def test_plelab_verbs_on_an_attached_folder(tmp_path, capsys):
    from plelab.cli import main

    for seed in (0, 1):  # two seeds trained a little: diagnose compares their Δ with W_0 regenerated from the seeds
        model = plelab.attach(tiny_host("llama"), 8, seed=seed, init="gemma")
        opt = plelab.adamw(plelab.param_groups(model, lr=1e-2))
        for step in range(3):
            ids = batch(10 + step, b=4)
            model(ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
        model.save_pretrained(tmp_path / f"s{seed}")
    assert main(["export", str(tmp_path / "s0"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "saved after plelab.attach" in err and "plelab.load_attached" in err and not (tmp_path / "out").exists()
    assert main(["generate", str(tmp_path / "s0"), "--prompt", "hi"]) == 2
    assert "plelab.load_attached" in capsys.readouterr().err
    rep = plelab.diagnose(tmp_path / "s0", reference=tmp_path / "s1", use=False, progress=False)
    assert any("W_0 regenerated from the seed" in n for n in rep["notes"])
    assert rep["table"]["basis"] == "Δ = W_t − W_0 (W_0 regenerated from the seeds plelab.attach recorded)"
    assert rep["table"]["verdict"]["reasons"][0].startswith("cross-seed CKA of Δ = W_t − W_0 (W_0 regenerated")
    assert not any("H: unknown" in line for line in rep["reliability"])  # the hidden size is read off config.json


@pytest.mark.parametrize("damage, needle", [
    (lambda c: c["plelab_ple"].pop("dim"), "entry lacks dim"),
    (lambda c: c["plelab_ple"].update(dim="8"), "PLE dim must be an integer"),
    (lambda c: c["plelab_ple"].update(gate="banana"), "unknown PLE gate 'banana'"),
    (lambda c: c.update(plelab_ple=[1]), "has no 'plelab_ple' entry"),
    (lambda c: c["plelab_ple"].pop("host_model_type"), "names no host_model_type"),
])
def test_load_attached_on_a_damaged_folder_is_one_line(tmp_path, damage, needle):
    _attached_with_a_live_branch().save_pretrained(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    damage(config)
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(plelab.PlelabError, match=needle):
        plelab.load_attached(tmp_path / "m")
