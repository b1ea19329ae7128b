"""torchrun with 2 CPU processes (gloo): DDP and FSDP2 follow the 1-process loss curve."""

import json
import os
import shutil

import pytest
from torchrun_launch import torchrun

ARGS = ["train", "--preset", "cpu-tiny", "--steps", "6", "--no-progress", "--set", "train.eval_every=3",
        "--set", "train.grad_accum=2", "--set", "train.precision=fp32"]


def _losses(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _launch(out, nproc, *extra, fault=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **({"PLELAB_FAULT": fault} if fault else {})}

    def start_again():  # a retry starts from a clean folder, or from the same one when resuming
        if "--resume" not in extra:
            shutil.rmtree(out, ignore_errors=True)

    proc = torchrun([f"--nproc_per_node={nproc}", "-m", "plelab", *ARGS, "--out", str(out), *extra], env=env,
                    retry=not fault, hang_is_teardown=lambda: (out / "summary.json").exists(),
                    before_retry=start_again)
    if fault:
        assert proc.returncode != 0
        return None
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _losses(out)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return _launch(tmp_path_factory.mktemp("one") / "run", 1)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_processes_match_one_process(single, tmp_path, mode):
    two = _launch(tmp_path / "run", 2, "--set", f"train.parallel={mode}")
    assert [r["step"] for r in two] == [r["step"] for r in single] == list(range(1, 7))
    for a, b in zip(single, two):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-4)
        if "val_loss" in a:
            assert b["val_loss"] == pytest.approx(a["val_loss"], abs=1e-4)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["tokens_seen"] == 6 * 8 * 64
    last = tmp_path / "run" / "checkpoints" / "step-000006"
    # DDP gathers to one file; FSDP2 writes each rank's shard (tests/test_scale_out.py resumes from them)
    assert (last / ("model.safetensors" if mode == "ddp" else "sharded")).exists()


@pytest.mark.slow
def test_ddp_killed_then_resumed_follows_the_same_curve(single, tmp_path):
    out = tmp_path / "run"
    _launch(out, 2, "--set", "train.checkpoint_every=3", fault="after_step:5")  # both ranks SIGKILLed
    resumed = _launch(out, 2, "--resume")
    for a, b in zip(single, resumed):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-4)
    assert [r["step"] for r in resumed] == list(range(1, 7))


@pytest.mark.slow
def test_ddp_row_sparse_table_matches_one_process(tmp_path):
    """The row-sparse table is left out of DDP and its rows are averaged by all-gather (train.sparse)."""
    sparse = ("--table-optimizer", "row-sparse", "--set", "train.diag_every=3")
    one = _launch(tmp_path / "one", 1, *sparse)
    two = _launch(tmp_path / "two", 2, *sparse)
    for a, b in zip(one, two):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-4)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    assert [r["step"] for r in two] == list(range(1, 7))


@pytest.mark.parametrize("launcher_exits", [False, True])  # True: a rank in its own session outlives the agent
def test_a_launch_that_hangs_after_its_work_is_cut_short_with_all_its_processes(tmp_path, monkeypatch,
                                                                               launcher_exits):
    """The test launcher's guard against gloo's teardown hang (tests/torchrun_launch.py): the grace starts when the
    work is done, and the whole process group dies (a rank once outlived the suite)."""
    import subprocess
    import sys
    import time

    import torchrun_launch

    monkeypatch.setattr(torchrun_launch, "TEARDOWN_GRACE", 0.5)
    done, child = tmp_path / "done", tmp_path / "child.pid"
    script = ("import pathlib, subprocess, sys, time\n"
              "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
              "start_new_session=True)\n"
              f"pathlib.Path({str(child)!r}).write_text(str(c.pid))\n"
              f"pathlib.Path({str(done)!r}).write_text('')\n"
              f"time.sleep({3 if launcher_exits else 120})\n")
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        torchrun_launch._run([sys.executable, "-c", script], dict(os.environ), 100, done.exists)
    assert time.monotonic() - start < 30
    pid = int(child.read_text())
    for _ in range(100):  # the killed grandchild is reaped by init; wait until it is gone
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"the launch's child {pid} outlived the kill")
