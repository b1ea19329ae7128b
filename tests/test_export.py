"""Out of plelab: `plelab export` (a dP=0 run as LlamaForCausalLM, a PLE run as PlelabForCausalLM), HF loading,
`generate()`, `AutoTokenizer`, and `plelab generate` with its KV cache — tested as an outside user would."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import transformers

import plelab
from plelab.cli import main
from plelab.integrations.hf import EXPORT_PLE_TRANSFORMERS, minor_version
from plelab.model.generate import KVCache, generate
from plelab.training.loading import load_for_eval

# transformers 5.0–5.12 read an exported PLE model back wrong: there export refuses it (.ci/run tests 5.0 too)
PLE_EXPORTS = minor_version(transformers.__version__) >= EXPORT_PLE_TRANSFORMERS


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three short runs: PLE (dP=8, tied), dP=0 tied with the √H scale, dP=0 untied without it."""
    root = tmp_path_factory.mktemp("export")
    variants = {"ple": {"ple.dim": 8}, "base": {"ple.dim": 0},
                "untied": {"ple.dim": 0, "model.tie_word_embeddings": False, "model.scale_embeddings": False}}
    for name, sets in variants.items():
        cfg = plelab.resolve_config("cpu-tiny", [f"{k}={v}" for k, v in {**sets, "train.steps": 4}.items()])
        plelab.train(cfg, root / name, progress=False)
    return root


def test_the_kv_cache_gives_the_full_forward_logits(tiny_cfg):
    tiny_cfg.ple.dim = 8
    model = plelab.build_model(tiny_cfg.model, tiny_cfg.ple, seed=0).eval()
    x = torch.randint(0, tiny_cfg.model.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    cache = KVCache()
    parts = [model(x[:, a:b], past_key_values=cache).logits for a, b in ((0, 5), (5, 9), (9, 10), (10, 11), (11, 12))]
    assert cache.get_seq_length() == 12
    torch.testing.assert_close(torch.cat(parts, 1), model(x).logits, atol=1e-5, rtol=0)
    a, b = (generate(model, x[:, :3], 6, temperature=0.9, top_k=7, seed=s) for s in (1, 1))
    assert torch.equal(a, b) and a.shape == (2, 6)
    greedy = generate(model, x[:, :3], 4, temperature=0)
    seq = x[:, :3]
    for _ in range(4):  # no cache: argmax of the full forward, token by token
        seq = torch.cat([seq, model(seq).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(greedy, seq[:, 3:])


@pytest.mark.slow
@pytest.mark.parametrize("name, arch", [("base", "LlamaForCausalLM"), ("untied", "LlamaForCausalLM"),
                                        ("ple", "PlelabForCausalLM")])
def test_export_round_trips_logits_generate_and_tokenizer(runs, tmp_path, capsys, name, arch):
    out = tmp_path / "hf"
    if name == "ple" and not PLE_EXPORTS:
        assert main(["export", str(runs / name), str(out)]) == 2
        assert "exporting a PLE run needs transformers >= 5.13" in capsys.readouterr().err and not out.exists()
        return
    assert main(["export", str(runs / name), str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"{arch} from step 4" in printed and "logits match" in printed
    if name == "base":
        assert "untied for Llama: model.embed_tokens = √H·E (√64), lm_head = E" in printed
    assert json.loads((out / "config.json").read_text())["architectures"] == [arch]
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == arch
    ours, _ = load_for_eval(runs / name)
    ids = torch.randint(0, 512, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids).logits, ours(ids).logits, atol=1e-5, rtol=0)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id == 0
    prompt = tok("The table of each layer", return_tensors="pt")
    theirs = hf.generate(**prompt, max_new_tokens=8, do_sample=False, eos_token_id=None)
    mine = generate(ours, prompt["input_ids"], 8, temperature=0)
    assert torch.equal(theirs[:, prompt["input_ids"].shape[1]:], mine)


@pytest.mark.slow
@pytest.mark.skipif(not PLE_EXPORTS, reason=f"transformers {transformers.__version__} cannot load a PLE export")
def test_a_ple_export_loads_after_import_plelab_in_a_fresh_process(runs, tmp_path):
    out = tmp_path / "hf"
    plelab.export(runs / "ple", out)
    code = ("import importlib.util, plelab, torch; "
            "assert importlib.util.find_spec('transformers'); "  # a library probing for transformers first
            "from transformers import AutoModelForCausalLM, AutoTokenizer; "
            f"m = AutoModelForCausalLM.from_pretrained({str(out)!r}); t = AutoTokenizer.from_pretrained({str(out)!r}); "
            "ids = t('The table', return_tensors='pt'); "
            "print(type(m).__name__, m.generate(**ids, max_new_tokens=3, do_sample=False).shape[1] - "
            "ids['input_ids'].shape[1])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["PlelabForCausalLM", "3"]


@pytest.mark.slow
def test_plelab_generate_is_seeded_and_greedy_matches_python(runs, capsys):
    argv = ["generate", str(runs / "ple"), "--prompt", "The table", "--max-new-tokens", "6", "--seed", "3"]
    outs = []
    for _ in range(2):
        assert main(argv) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and outs[0].startswith("The table")
    assert main([*argv, "--temperature", "0"]) == 0
    greedy = capsys.readouterr().out
    assert greedy == "The table" + plelab.generate_text(runs / "ple", "The table", 6, temperature=0) + "\n"


@pytest.mark.slow
def test_export_refuses_a_null_control_run_and_an_existing_folder(runs, tmp_path, capsys):
    cfg = plelab.resolve_config("cpu-tiny", ["ple.dim=8", "ple.ids=iid", "train.steps=2"])
    plelab.train(cfg, tmp_path / "iid", progress=False)
    capsys.readouterr()
    assert main(["export", str(tmp_path / "iid"), str(tmp_path / "out")]) == 2
    assert "null-control run" in capsys.readouterr().err and not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.*"))  # nothing half-written left behind
