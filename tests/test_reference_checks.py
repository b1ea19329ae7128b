"""`plelab diagnose --reference` takes only a second seed (issue 53 item 4): a run folder is read at the diagnosed
checkpoint's step (or the nearest, noted — never silently its latest), and a reference of another model, table
shape, precision or corpus, or with the same seed, is refused in one line naming what differs, unless
--allow-mismatch (CLI) / allow_mismatch=True (Python), which writes the differences into the notes."""

from __future__ import annotations

import json
import shutil

import pytest
from hf_models import batch, tiny_host

import plelab
from plelab.cli import main
from plelab.config import resolve_config
from plelab.diagnostics.diagnose import diagnose_run as diagnose
from plelab.errors import PlelabError
from plelab.runs import train


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_data):
    root = tmp_path_factory.mktemp("reference")

    def run(name, seed, *sets, steps=8, every=4):
        cfg = resolve_config("cpu-tiny", [f"train.checkpoint_every={every}", "train.keep_checkpoints=5",
                                          "train.eval_every=4", "train.diag_every=0", "train.precision=fp32", *sets],
                             seed=seed, steps=steps)  # fp32 pinned: a module fixture runs outside the flags' mock
        train(cfg, root / name, data=tiny_data, progress=False, log=lambda *a: None)
        return root / name

    out = {"a": run("a", 0), "b": run("b", 1, steps=12), "c": run("c", 1, every=3),
           "wide": run("wide", 1, "model.hidden_size=96"), "bf16": run("bf16", 1, "train.precision=bf16"),
           "dp8": run("dp8", 1, "ple.dim=8")}
    corpus = root / "corpus"  # b's checkpoints, as if trained on another corpus
    shutil.copytree(out["b"], corpus)
    for state in corpus.glob("checkpoints/*/state.json"):
        saved = json.loads(state.read_text())
        state.write_text(json.dumps({**saved, "corpus_fingerprint": "f" * 64}))
    out["corpus"] = corpus
    return out


@pytest.mark.slow
def test_a_reference_run_is_read_at_the_diagnosed_step_not_its_latest(runs):
    rep = diagnose(runs["a"], reference=runs["b"], use=False, progress=False)
    assert rep["step"] == 8 and rep["compared_with"]["--reference"]["step"] == 8
    assert rep["compared_with"]["--reference"]["checkpoint"].endswith("step-000008")
    assert any("its checkpoint at step 8" in n and "not its latest (step 12)" in n for n in rep["notes"])
    assert rep["table"]["cross_seed"]["cka"] > 0


@pytest.mark.slow
def test_the_nearest_step_is_used_and_said_when_the_same_is_missing(runs, capsys):
    rep = diagnose(runs["a"] / "checkpoints" / "step-000004", reference=runs["c"], use=False, progress=False)
    assert rep["step"] == 4 and rep["compared_with"]["--reference"]["step"] == 3
    assert any("no checkpoint at step 4: the nearest, step 3, was compared" in n for n in rep["notes"])
    assert main(["diagnose", str(runs["a"] / "checkpoints" / "step-000004"), "--reference", str(runs["c"]),
                 "--no-use", "--no-progress"]) == 0
    assert "the nearest, step 3, was compared" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("other, needle", [
    ("wide", "hidden size 64 vs 96"),
    ("bf16", "train.precision fp32 vs bf16"),
    ("dp8", "table shape [512, 2, 16] vs [512, 2, 8]"),
    ("corpus", "corpus fingerprint"),
    ("a", "the same seed (0: not a second seed)"),
])
def test_a_reference_that_is_not_a_second_seed_is_refused_in_one_line(runs, capsys, other, needle):
    capsys.readouterr()
    assert main(["diagnose", str(runs["a"]), "--reference", str(runs[other]), "--no-use", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert needle in err and "--allow-mismatch" in err and err.count("\n") == 1, err
    with pytest.raises(PlelabError, match="is not a second seed"):
        plelab.diagnose(runs["a"], reference=runs[other], use=False, progress=False)


@pytest.mark.slow
def test_allow_mismatch_compares_and_says_what_differs(runs, capsys):
    rep = diagnose(runs["a"], reference=runs["wide"], use=False, progress=False, allow_mismatch=True)
    assert any(n.startswith("--allow-mismatch: --reference") and "hidden size 64 vs 96" in n for n in rep["notes"])
    assert rep["table"]["cross_seed"] is not None
    rep = plelab.diagnose(runs["a"], reference=runs["bf16"], use=False, progress=False, allow_mismatch=True)
    assert any("train.precision fp32 vs bf16" in n for n in rep["notes"])
    assert main(["diagnose", str(runs["a"]), "--reference", str(runs["dp8"]), "--allow-mismatch", "--no-use",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "table shape [512, 2, 16] vs [512, 2, 8]" in out


@pytest.mark.slow
def test_allow_mismatch_without_a_comparison_is_refused(runs):
    with pytest.raises(PlelabError, match="--allow-mismatch"):
        diagnose(runs["a"], use=False, progress=False, allow_mismatch=True)


@pytest.mark.slow
def test_a_null_run_of_another_precision_is_refused_too(runs):
    with pytest.raises(PlelabError, match="--null .* is not a matched null run.*train.precision"):
        diagnose(runs["a"], null_run=runs["bf16"], use=False, progress=False)


def test_hf_folders_of_another_architecture_are_refused(tmp_path, capsys):
    for name, kind, seed in (("llama-0", "llama", 0), ("llama-1", "llama", 1), ("qwen3-1", "qwen3", 1)):
        model = plelab.attach(tiny_host(kind), 8, seed=seed, init="gemma")
        opt = plelab.adamw(plelab.param_groups(model, lr=1e-2))
        model(batch(), labels=batch()).loss.backward()  # one step: Δ from the recorded W_0 is not 0
        opt.step()
        model.save_pretrained(tmp_path / name)
    capsys.readouterr()
    assert main(["diagnose", str(tmp_path / "llama-0"), "--reference", str(tmp_path / "qwen3-1"),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "model type llama vs qwen3" in err and err.count("\n") == 1, err
    assert main(["diagnose", str(tmp_path / "llama-0"), "--reference", str(tmp_path / "llama-0"),
                 "--no-progress"]) == 2
    assert "the same seed" in capsys.readouterr().err
    assert main(["diagnose", str(tmp_path / "llama-0"), "--reference", str(tmp_path / "llama-1"),
                 "--no-progress"]) == 0
    assert main(["diagnose", str(tmp_path / "llama-0"), "--reference", str(tmp_path / "qwen3-1"),
                 "--allow-mismatch", "--no-progress"]) == 0
    assert "differs from this run: model type llama vs qwen3" in capsys.readouterr().out
