"""Checkpoints: kill -9 and resume end bit-identical; damaged, foreign and mismatched checkpoints fail clearly."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from plelab.cli import main
from plelab.training.checkpoint import list_checkpoints

TRAIN = ["train", "--preset", "cpu-tiny", "--steps", "45", "--no-progress",
         "--set", "train.checkpoint_every=10", "--set", "train.keep_checkpoints=2", "--set", "train.eval_every=15",
         "--set", "train.precision=fp32"]  # pinned: an AMX CPU's auto may pick bf16


def _run(out: Path, *extra: str, fault: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("PLELAB_FAULT", None)
    if fault:
        env["PLELAB_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "plelab", *TRAIN, "--out", str(out), *extra],
                          capture_output=True, text=True, env=env, timeout=300)


def _losses(run: Path) -> list[dict]:
    """Every metrics row without the wall-clock fields."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("tokens_per_second", "mfu")} for r in rows]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "run"
    proc = _run(out)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["after_step:27", "mid_checkpoint:30"])
def test_kill_9_then_resume_is_bit_identical(reference, tmp_path, fault):
    out = tmp_path / "run"
    killed = _run(out, fault=fault)
    assert killed.returncode == -9  # really SIGKILLed
    steps = [int(p.name.split("-")[1]) for p in list_checkpoints(out)]
    assert steps == [10, 20]  # the checkpoint being written at the kill is not visible
    resumed = _run(out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed" in resumed.stdout and "step-000020" in resumed.stdout
    assert _losses(out) == _losses(reference)
    final = load_file(str(out / "checkpoints" / "step-000045" / "model.safetensors"))
    ref = load_file(str(reference / "checkpoints" / "step-000045" / "model.safetensors"))
    assert final.keys() == ref.keys() and all(final[k].equal(ref[k]) for k in ref)
    opt = load_file(str(out / "checkpoints" / "step-000045" / "optimizer.safetensors"))
    opt_ref = load_file(str(reference / "checkpoints" / "step-000045" / "optimizer.safetensors"))
    assert all(opt[k].equal(opt_ref[k]) for k in opt_ref)
    assert [p.name for p in list_checkpoints(out)] == ["step-000040", "step-000045"]  # keep-last-2
    assert not list((out / "checkpoints").glob("*.tmp-*"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 45 and summary["tokens_seen"] == 45 * 8 * 64


@pytest.mark.slow
def test_checkpoint_uses_hf_names_and_no_pickle(reference):
    ckpt = list_checkpoints(reference)[-1]
    assert sorted(p.name for p in ckpt.iterdir()) == ["diagnostics.json", "model.safetensors", "optimizer.safetensors",
                                                      "state.json"]
    names = load_file(str(ckpt / "model.safetensors")).keys()
    assert "model.embed_tokens_per_layer.weight" in names and "model.layers.1.per_layer_input_gate.weight" in names
    state = json.loads((ckpt / "state.json").read_text())
    assert state["format"] == "plelab-checkpoint-v1" and state["step"] == 45


def _copy_run(reference: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(reference, dst)
    return dst


@pytest.mark.slow
def test_existing_run_is_never_overwritten(reference, capsys):
    before = (reference / "metrics.jsonl").read_bytes()
    assert main([*TRAIN, "--out", str(reference)]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (reference / "metrics.jsonl").read_bytes() == before


@pytest.mark.slow
def test_damaged_checkpoints_give_one_line_errors(reference, tmp_path, capsys):
    run = _copy_run(reference, tmp_path / "trunc")
    latest = list_checkpoints(run)[-1] / "model.safetensors"
    latest.write_bytes(latest.read_bytes()[:1000])
    assert main([*TRAIN, "--out", str(run), "--resume", "--steps", "50"]) == 2
    err = capsys.readouterr().err
    assert "is damaged or truncated" in err and err.count("\n") == 1

    run = _copy_run(reference, tmp_path / "foreign")
    latest = list_checkpoints(run)[-1]
    (latest / "model.safetensors").write_bytes(b"\x80\x04\x95 a pickle, not safetensors")
    assert main([*TRAIN, "--out", str(run), "--resume", "--steps", "50"]) == 2
    assert "is damaged or truncated" in capsys.readouterr().err

    run = _copy_run(reference, tmp_path / "noformat")
    (list_checkpoints(run)[-1] / "state.json").write_text('{"format": "something-else"}')
    assert main([*TRAIN, "--out", str(run), "--resume", "--steps", "50"]) == 2
    assert "expected plelab-checkpoint-v1" in capsys.readouterr().err


@pytest.mark.slow
def test_resume_with_another_config_is_refused(reference, tmp_path, capsys):
    run = _copy_run(reference, tmp_path / "other")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert main([*TRAIN, "--out", str(run), "--resume", "--dp", "32"]) == 2
    err = capsys.readouterr().err
    assert "trained with a different ple" in err and err.count("\n") == 1
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before  # nothing touched
    text = tmp_path / "other.txt"
    text.write_text("\n\n".join(f"Another corpus, line {i}." for i in range(3000)))
    assert main([*TRAIN, "--out", str(run), "--resume", "--data", str(text),
                 "--set", "model.vocab_size=512"]) == 2
    assert "trained on another corpus" in capsys.readouterr().err
    assert main([*TRAIN, "--out", str(run), "--resume", "--preset", "cpu-small"]) == 2
    assert "differs from the run's preset" in capsys.readouterr().err


@pytest.mark.slow
def test_loading_weights_of_another_shape_is_refused(reference, tmp_path):
    from plelab.config import resolve_config
    from plelab.errors import PlelabError
    from plelab.model import build_model
    from plelab.training.checkpoint import load_model_weights

    cfg = resolve_config("cpu-tiny", dp=32)
    model = build_model(cfg.model, cfg.ple)
    with pytest.raises(PlelabError, match=r"embed_tokens_per_layer.weight has shape \(512, 32\).*expects \(512, 64\)"):
        load_model_weights(model, list_checkpoints(reference)[-1])


def test_finished_run_and_end_only_checkpoints(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "--preset", "cpu-tiny", "--steps", "7", "--no-progress", "--out", str(out),
            "--set", "train.checkpoint_every=0"]
    assert main(args) == 0
    assert [p.name for p in list_checkpoints(out)] == ["step-000007"]
    summary = (out / "summary.json").read_bytes()
    capsys.readouterr()
    assert main(args + ["--resume"]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert (out / "summary.json").read_bytes() == summary
    assert main(["train", "--out", " ", "--preset", "cpu-tiny"]) == 2
    assert "--out is empty" in capsys.readouterr().err


@pytest.mark.slow
def test_partial_last_metrics_line_is_dropped_on_resume(reference, tmp_path):
    run = _copy_run(reference, tmp_path / "partial")
    import shutil

    shutil.rmtree(list_checkpoints(run)[-1])  # resume from step 40
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 46, "loss": 1.2')  # a line cut short by a crash
    proc = _run(run, "--resume")
    assert proc.returncode == 0, proc.stderr
    assert _losses(run) == _losses(reference)
