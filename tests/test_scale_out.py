"""Scale-out under torchrun (gloo, CPU): sharded initialisation, sharded checkpoints resumed at other world sizes,
a torn sharded checkpoint passed over, consolidation for eval, and activation checkpointing."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torchrun_launch import torchrun

import plelab.model.init as init
from plelab.cli import main
from plelab.config import resolve_config
from plelab.training.checkpoint import latest_intact, list_checkpoints

HERE = Path(__file__).parent
# batch 12: whole micro-batches at 1, 2 and 3 processes, so every world size computes the same global mean
TRAIN = ["train", "--preset", "cpu-tiny", "--steps", "6", "--no-progress", "--set", "train.eval_every=3",
         "--set", "train.batch_size=12", "--set", "train.checkpoint_every=3", "--set", "train.parallel=fsdp",
         "--set", "train.precision=fp32"]


def _env(fault=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE)}
    env.pop("PLELAB_FAULT", None)
    return {**env, **({"PLELAB_FAULT": fault} if fault else {})}


def _torchrun(nproc, *args, fault=None):
    # every launch here is safe to repeat as it stands (a resume resumes), so a retry needs no clean-up
    proc = torchrun([f"--nproc_per_node={nproc}", *args], env=_env(fault), timeout=240, retry=fault is None)
    if fault is None:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _train(out, nproc, *extra, fault=None):
    if nproc == 1:
        return subprocess.run([sys.executable, "-m", "plelab", *TRAIN, "--out", str(out), *extra],
                              capture_output=True, text=True, timeout=240, env=_env(fault))
    return _torchrun(nproc, "-m", "plelab", *TRAIN, "--out", str(out), *extra, fault=fault)


def _losses(run):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"], r.get("val_loss")) for r in rows]


def _same_curve(a, b):
    assert [s for s, _, _ in a] == [s for s, _, _ in b] == list(range(1, 7))
    for (_, la, va), (_, lb, vb) in zip(a, b):
        assert lb == pytest.approx(la, abs=1e-5)  # float summation order across shards only
        assert (va is None) == (vb is None) and (va is None or vb == pytest.approx(va, abs=1e-5))


def test_blocked_init_draws_any_rows_exactly(monkeypatch):
    whole = init.initial_normal("w", (50, 6), seed=2, std=0.02)
    monkeypatch.setattr(init, "INIT_BLOCK", 6 * 7)  # 7 rows per block
    assert init.init_block_rows((50, 6)) == 7
    blocked = init.initial_normal("w", (50, 6), seed=2, std=0.02)
    assert not torch.equal(blocked, whole)  # another draw: only tensors above INIT_BLOCK are drawn in blocks
    for start, stop in ((0, 50), (0, 7), (3, 4), (6, 8), (13, 29), (49, 50), (20, 20)):
        assert torch.equal(init.initial_normal("w", (50, 6), 2, 0.02, rows=(start, stop)), blocked[start:stop])
    assert blocked.std().item() == pytest.approx(0.02, rel=0.2)
    with pytest.raises(ValueError, match="outside"):
        init.initial_normal("w", (50, 6), 2, 0.02, rows=(40, 51))


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 3])
def test_sharded_init_equals_single_process_init(tmp_path, nproc):
    out = tmp_path / "init.json"
    _torchrun(nproc, str(HERE / "sharded_init_script.py"), str(out), str(64 * 100))
    got = json.loads(out.read_text())
    assert got["same_names"] and got["different"] == []
    assert "model.embed_tokens.weight" in got["blocked"] and "model.embed_tokens_per_layer.weight" in got["blocked"]
    assert sum(got["shares"]) == got["total"]
    assert max(got["shares"]) <= got["total"] / nproc * 1.1  # each rank holds ~1/world of the model from the start


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "run"
    proc = _train(out, 1, "--set", "train.parallel=ddp")
    assert proc.returncode == 0, proc.stderr
    return _losses(out)


@pytest.mark.slow
def test_sharded_checkpoint_resumes_at_other_world_sizes(single, tmp_path, capsys):
    two = tmp_path / "two"  # 2 processes with activation checkpointing, killed after step 4 (checkpoint at 3)
    killed = _train(two, 2, "--set", "train.activation_checkpointing=true", fault="after_step:4")
    assert killed.returncode != 0
    ckpt = two / "checkpoints" / "step-000003"
    assert [p.name for p in list_checkpoints(two)] == [ckpt.name]
    state = json.loads((ckpt / "state.json").read_text())
    assert state["storage"] == "sharded" and state["world_size"] == 2
    assert sorted(p.name for p in (ckpt / "sharded" / "model").iterdir()) == [
        "shard-00001-model-00001-of-00001.safetensors", "shard-00002-model-00001-of-00001.safetensors"]
    one = tmp_path / "one"
    shutil.copytree(two, one)

    _train(two, 3, "--resume")  # 2 -> 3 processes
    _same_curve(_losses(two), single)
    assert len(list((two / "checkpoints" / "step-000006" / "sharded" / "model").iterdir())) == 3
    resumed = _train(one, 1, "--resume")  # 2 -> 1 process: the single-file layout from then on
    assert resumed.returncode == 0, resumed.stderr
    _same_curve(_losses(one), single)
    assert (one / "checkpoints" / "step-000006" / "model.safetensors").exists()

    # plelab eval needs the single file: refused in one line, then consolidated, then the run's own val loss
    assert main(["eval", str(two)]) != 0
    assert "plelab consolidate" in capsys.readouterr().err
    assert main(["consolidate", str(two)]) == 0
    assert main(["eval", str(two)]) == 0
    assert f"validation loss {single[-1][2]:.4f}" in capsys.readouterr().out

    # a torn sharded checkpoint (one rank's file cut short) is passed over for the one before it
    shard = two / "checkpoints" / "step-000006" / "sharded" / "optim" / "shard-00002-model-00001-of-00001.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    said = []
    assert latest_intact(two, said.append).name == "step-000003"
    assert "step-000006 is torn" in said[0] and "bytes" in said[0]
    again = _train(two, 1, "--resume")
    assert again.returncode == 0, again.stderr
    assert "step-000006 is torn" in again.stdout and "resumed" in again.stdout
    _same_curve(_losses(two), single)


def test_activation_checkpointing_gives_the_same_losses_and_gradients():
    cfg = resolve_config("cpu-tiny", ["ple.dim=8"])
    ids = torch.randint(0, cfg.model.vocab_size, (2, 17), generator=torch.Generator().manual_seed(0))
    grads = []
    for recompute in (False, True):
        model = init.build_model(cfg.model, cfg.ple, seed=1, activation_checkpointing=recompute)
        loss = model(ids, labels=ids, return_logits=False).loss
        loss.backward()
        grads.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (l0, g0), (l1, g1) = grads
    assert torch.equal(l0, l1)
    assert all(torch.equal(g0[n], g1[n]) for n in g0)
