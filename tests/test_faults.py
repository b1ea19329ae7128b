"""Fault tests: NaN / Inf losses, a full disk, and a sweep killed at random points three times.

(kill -9 mid-step and mid-checkpoint, then resume bit-identical: tests/test_checkpoint.py.)
"""

import errno
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from plelab.config import resolve_config
from plelab.errors import PlelabError
from plelab.runs import make_trainer
from plelab.training import checkpoint as ckpt


def _hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _cfg(steps=6, *sets):
    return resolve_config("cpu-tiny", ["train.checkpoint_every=2", "train.eval_every=2", "train.diag_windows=0",
                                       *sets], dp=16, steps=steps)


def _trainer(cfg, data, run, resume=False):
    return make_trainer(cfg, data, run, resume=resume, progress=False, log=lambda *a: None)


@pytest.fixture
def trained(tmp_path, tiny_data):
    """A run trained to step 4 (checkpoints at 2 and 4), to be continued to step 6."""
    run = tmp_path / "run"
    _trainer(_cfg(4), tiny_data, run).fit()
    return run


def test_nonfinite_loss_stops_naming_layer_and_step_and_keeps_the_checkpoint(trained, tiny_data):
    checkpoints = _hashes(trained / "checkpoints")
    tr = _trainer(_cfg(6), tiny_data, trained, resume=True)
    tr.lm.model.layers[1].mlp.up_proj.weight.data[3, 5] = float("inf")  # a weight blows up
    with pytest.raises(PlelabError) as err:
        tr.fit()
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("the loss became nan at step 5;")
    assert "model.layers.1.mlp.up_proj (layer 1)" in msg and "non-finite weights: model.layers.1.mlp.up_proj" in msg
    assert "step-000004) is kept" in msg and "train.skip_nonfinite" in msg
    assert _hashes(trained / "checkpoints") == checkpoints  # nothing written, nothing lost
    again = _trainer(_cfg(6), tiny_data, trained, resume=True)  # the kept checkpoint resumes
    assert again.step == 4 and again.fit().final_val_loss > 0


def test_skip_nonfinite_skips_up_to_the_limit(trained, tiny_data):
    tr = _trainer(_cfg(6, "train.skip_nonfinite=1"), tiny_data, trained, resume=True)
    loss = tr.task.loss
    tr.task.loss = lambda forward, batch: loss(forward, batch) * (float("nan") if tr.step == 4 else 1.0)
    before = [p.detach().clone() for p in tr.model.parameters()]
    tr.fit()
    rows = [json.loads(x) for x in (trained / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert "loss" not in rows[4] and "the loss became nan" in rows[4]["skipped"]
    assert "(skip 1 of train.skip_nonfinite=1)" in rows[4]["skipped"]
    assert json.loads((trained / "summary.json").read_text())["skipped_steps"] == 1
    assert int(tr.rows["text"].counts.sum()) == 5 * 8 * 64  # table rows of the five trained steps only (B=8, T=64)
    assert any(not (a == b).all() for a, b in zip(before, tr.model.parameters()))  # step 6 trained
    tr2 = _trainer(_cfg(8, "train.skip_nonfinite=1"), tiny_data, trained, resume=True)
    assert tr2.skipped_steps == 1  # the count survives a resume: the limit is per run
    loss2 = tr2.task.loss
    tr2.task.loss = lambda forward, batch: loss2(forward, batch) * float("nan")
    with pytest.raises(PlelabError, match="the loss became nan at step 7"):
        tr2.fit()


def test_nonfinite_gradient_is_named_before_any_clipping(trained, tiny_data):
    tr = _trainer(_cfg(6), tiny_data, trained, resume=True)
    weight = tr.lm.model.layers[0].mlp.down_proj.weight
    # NaN, not Inf: clipping first would turn every gradient into NaN and name the wrong parameters
    weight.register_hook(lambda g: torch.full_like(g, float("nan")) if tr.step == 4 else g)
    with pytest.raises(PlelabError) as err:
        tr.fit()
    msg = str(err.value)
    assert msg.startswith("the gradient norm became nan at step 5;")
    assert "every forward output is finite: the backward pass produced it" in msg
    assert "non-finite gradients: model.layers.0.mlp.down_proj.weight (layer 0)" in msg  # only the culprit
    assert "non-finite weights" not in msg


def test_no_space_left_while_checkpointing(trained, tiny_data, monkeypatch):
    checkpoints = _hashes(trained / "checkpoints")
    real = ckpt.save_safetensors

    def full_disk(tensors, path, metadata=None):
        if str(path).endswith("optimizer.safetensors"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(tensors, path, metadata=metadata)

    monkeypatch.setattr(ckpt, "save_safetensors", full_disk)
    with pytest.raises(PlelabError) as err:
        _trainer(_cfg(6), tiny_data, trained, resume=True).fit()
    msg = str(err.value)
    assert "cannot write checkpoint step-000006" in msg and "No space left on device" in msg
    assert "the previous checkpoint step-000004 is intact" in msg and "\n" not in msg
    assert _hashes(trained / "checkpoints") == checkpoints  # no half checkpoint left, the others untouched
    monkeypatch.setattr(ckpt, "save_safetensors", real)  # space freed: the run continues from step 4
    tr = _trainer(_cfg(6), tiny_data, trained, resume=True)
    assert tr.step == 4
    tr.fit()
    assert [p.name for p in ckpt.list_checkpoints(trained)] == ["step-000004", "step-000006"]


def _progress(root: Path) -> int:
    """Steps recorded so far over all runs of a sweep."""
    total = 0
    for path in root.glob("runs/*/seed-*/metrics.jsonl"):
        try:
            total += sum(1 for line in path.read_text().splitlines() if line.strip())
        except OSError:
            pass
    return total


@pytest.mark.slow
def test_sweep_killed_at_random_points_three_times_runs_everything_once(tmp_path, tiny_data):
    """Three kills (the sweep and its workers, like a lost node), each at a random point of the remaining work:
    a random number of recorded steps past the last kill, plus a random delay up to half a second."""
    root = tmp_path / "sw"
    steps, runs = 60, 4
    cmd = [sys.executable, "-m", "plelab", "sweep", "--preset", "cpu-tiny", "--dp", "0,8", "--seeds", "2",
           "--steps", str(steps), "--out", str(root), "--no-report", "--no-progress", "--jobs", "2",
           "--set", "train.checkpoint_every=10", "--set", "train.eval_every=10", "--set", "train.diag_windows=0"]
    rng = random.Random(7)
    at_kill = []
    for _ in range(3):
        now = _progress(root)
        target = rng.randint(min(now + 1, steps * runs - 10), min(now + 60, steps * runs - 10))
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 120
        while proc.poll() is None and _progress(root) < target and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(rng.uniform(0, 0.5))
        assert proc.poll() is None, "the sweep finished before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        at_kill.append(_progress(root))
    assert 0 < at_kill[0] and at_kill[-1] < steps * runs  # every kill landed mid-sweep, after training began
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    found = sorted(root.glob("runs/*/seed-*"))
    assert len(found) == runs
    for run in found:
        recorded = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
        assert recorded == list(range(1, steps + 1)), run  # every step recorded once, none redone twice
        assert json.loads((run / "summary.json").read_text())["steps"] == steps
        assert not list((run / "checkpoints").glob("*.tmp-*"))
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and f"{runs} already done, 0 to run" in again.stdout


def _workers_of(root: Path) -> list[int]:
    """Pids of live processes whose command line names ``root`` (the sweep's workers: ``plelab train --out …``)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError, ValueError):
            continue
        if proc.name.isdigit() and " train " in cmdline and str(root) in cmdline and state != "Z":
            found.append(int(proc.name))
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads the process table from /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_sweep_stopped_by_a_signal_stops_its_workers_and_says_how_to_resume(tmp_path, tiny_data, sig):
    """``kill`` (or ``scancel``, or a closed terminal) on the sweep alone: no worker trains on, orphaned."""
    root = tmp_path / "sw"
    cmd = [sys.executable, "-m", "plelab", "sweep", "--preset", "cpu-tiny", "--dp", "0,8", "--seeds", "1",
           "--steps", "100000", "--out", str(root), "--no-report", "--no-progress", "--jobs", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(_workers_of(root)) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_workers_of(root)) == 2, "the sweep never started its two workers"
        proc.send_signal(sig)  # the sweep only, not its process group
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 143
        assert err.strip().splitlines()[-1].startswith(f"plelab: error: stopped by {sig.name}: the running workers "
                                                        "were stopped; rerun the same command to resume")
        assert "Traceback" not in err
        assert _workers_of(root) == []
    finally:  # whatever failed above, nothing of this test trains on
        proc.kill()
        for pid in _workers_of(root):
            os.kill(pid, signal.SIGKILL)
