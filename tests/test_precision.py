"""Precision: ``train.precision=auto`` resolved per machine and shape (CPU flags mocked, so CI's own CPU does not
decide), once per run and once per study, recorded and kept on resume; bf16 training deterministic and exactly
resumable; attention fp32 under CPU autocast; the chunked LM-head loss equal to the plain one."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import plelab.precision as precision
from plelab.config import resolve_config
from plelab.model import build_model
from plelab.precision import BF16_MARGIN, resolve_precision, study_precision
from plelab.runs import make_trainer
from plelab.sweeps.runner import _device, _precision_line, prepare_runs, run_config, sweep_precision
from plelab.sweeps.spec import Arm, SweepSpec

CPU = torch.device("cpu")
GEMMS = [(256, 64, 176)]


@pytest.fixture(autouse=True)
def _peak(monkeypatch):
    """The large GEMM's bf16 gain, as an AMX CPU measures it (CI's CPU has no bf16 units): the mocked probes'
    readings below are within its bounds (tests/test_precision_probe.py tests the bounds)."""
    monkeypatch.setattr(precision, "gemm_peak_ratio", lambda: 8.0)


def _flags(monkeypatch, flags):
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: tuple(flags))


def _no_probe(gemms):
    raise AssertionError("the probe ran")


def test_auto_on_cpu_needs_the_flags_and_a_probe_that_confirms(monkeypatch):
    _flags(monkeypatch, [])
    choice = resolve_precision("auto", CPU, GEMMS, probe=_no_probe)  # no flags: no probe, fp32
    assert choice.resolved == "fp32" and "no bf16 matrix flags" in choice.reason
    _flags(monkeypatch, ["amx_bf16"])
    fast = resolve_precision("auto", CPU, GEMMS, probe=lambda g: (2.0, 1.0))
    assert fast.resolved == "bf16" and fast.bf16 and "2.00×" in fast.reason
    at_margin = resolve_precision("auto", CPU, GEMMS, probe=lambda g: (BF16_MARGIN * 0.999, 1.0))
    assert at_margin.resolved == "fp32"  # the tie (and anything short of the margin) goes to fp32
    slow = resolve_precision("auto", CPU, GEMMS, probe=lambda g: (1.0, 2.0))
    assert slow.resolved == "fp32" and "0.50×" in slow.reason
    for forced in ("fp32", "bf16"):
        assert resolve_precision(forced, CPU, GEMMS, probe=_no_probe).resolved == forced
    assert resolve_precision("auto", torch.device("cuda"), GEMMS, probe=_no_probe).resolved == "bf16"


def test_the_real_probe_times_the_gemm_list_in_both_dtypes():
    fp32_s, bf16_s = precision.probe_bf16(precision.step_gemms(GEMMS), repeats=1)
    assert fp32_s > 0 and bf16_s > 0
    assert precision.step_gemms([(8, 4, 6)]) == [(8, 4, 6), (8, 6, 4), (6, 8, 4)]  # forward, dX, dW


def test_a_study_resolves_once_keeps_fp32_on_cpu_and_a_grown_sweep_keeps_what_its_runs_recorded(monkeypatch,
                                                                                                   tmp_path):
    _flags(monkeypatch, ["amx_bf16", "avx512_bf16"])  # even on a CPU where a single run would probe
    monkeypatch.setattr(precision, "probe_bf16", _no_probe)
    assert study_precision("auto", CPU).resolved == "fp32" and study_precision("bf16", CPU).resolved == "bf16"
    spec = SweepSpec(preset="cpu-tiny", seeds=[0], arms=[Arm("dp0", ["ple.dim=0"]), Arm("dp16", ["ple.dim=16"]),
                                                        Arm("bf16", ["ple.dim=16", "train.precision=bf16"])])
    choice = sweep_precision(tmp_path / "a", spec)
    got = {a.name: run_config(spec, a, 0, choice.resolved).train.precision for a in spec.arms}
    assert got == {"dp0": "fp32", "dp16": "fp32", "bf16": "bf16"}  # an arm's own explicit value is kept
    jobs = prepare_runs(tmp_path / "a", spec, choice.resolved)  # writes every run's config.json
    line = _precision_line(choice, jobs, _device(spec))  # what run_sweep prints once
    assert line.startswith("precision fp32 — auto: a CPU study trains in fp32") and line.endswith("own: bf16")
    jobs[0].cfg.train.precision = "auto"  # a run started before precision was resolved: fp32 on this CPU
    assert _precision_line(choice, jobs, _device(spec)) == line
    # a sweep started where its study resolved otherwise (e.g. on a GPU) grows in what its runs recorded
    cfg_file = tmp_path / "a" / "runs" / "dp0" / "seed-0" / "config.json"
    saved = json.loads(cfg_file.read_text())
    saved["train"]["precision"] = "bf16"
    cfg_file.write_text(json.dumps(saved))
    grown = SweepSpec(preset="cpu-tiny", seeds=[0], arms=[*spec.arms, Arm("dp32", ["ple.dim=32"])])
    kept = sweep_precision(tmp_path / "a", grown)
    assert kept.resolved == "bf16" and "recorded by this sweep's started runs" in kept.reason
    assert run_config(grown, grown.arms[-1], 0, kept.resolved).train.precision == "bf16"
    assert sweep_precision(tmp_path / "b", grown).resolved == "fp32"  # a fresh folder: the study rule


def _trainer(tmp_path, tiny_data, *sets, resume=False):
    cfg = resolve_config("cpu-tiny", ["train.eval_every=3", "train.checkpoint_every=3", *sets], steps=3)
    return make_trainer(cfg, tiny_data, tmp_path / "run", resume=resume, progress=False, log=lambda *a: None)


def test_the_probe_runs_once_per_machine_thread_count_and_shape(monkeypatch, tmp_path):
    """A fresh process of the same run on the same machine resolves as the last one did (no timing lottery)."""
    monkeypatch.setenv("PLELAB_CACHE", str(tmp_path))
    _flags(monkeypatch, ["amx_bf16"])
    timings = iter([(1.3, 1.0), (1.2, 1.0), (1.0, 1.0)])  # at, below and far below the margin
    calls = []
    monkeypatch.setattr(precision, "probe_bf16", lambda g: calls.append(g) or next(timings))
    first = resolve_precision("auto", CPU, GEMMS)
    again = resolve_precision("auto", CPU, GEMMS)
    assert first.resolved == again.resolved == "bf16" and len(calls) == 1
    assert "stored in" in again.reason and "stored in" not in first.reason
    assert resolve_precision("auto", CPU, [(128, 64, 176)]).resolved == "fp32" and len(calls) == 2  # another shape
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        resolve_precision("auto", CPU, GEMMS)
    finally:
        torch.set_num_threads(threads)
    assert len(calls) == 3  # another thread count


@pytest.mark.slow
def test_a_run_records_its_resolution_and_a_resume_never_probes_again(monkeypatch, tmp_path, tiny_data, capsys):
    monkeypatch.setenv("PLELAB_CACHE", str(tmp_path / "cache"))  # the mocked probe's verdict stays in this test
    _flags(monkeypatch, ["amx_bf16"])
    seen = []
    monkeypatch.setattr(precision, "probe_bf16", lambda g: seen.append(g) or (3.0, 1.0))
    tr = _trainer(tmp_path, tiny_data)
    assert tr.env.bf16 and len(seen) == 1
    H, mb, T = 64, 8, 64  # the probe timed this run's own shapes (micro-batch × seq_len rows)
    assert (mb * T, H, 176) in seen[0] and (176, mb * T, H) in seen[0]
    tr.fit()
    run = tmp_path / "run"
    assert json.loads((run / "config.json").read_text())["train"]["precision"] == "bf16"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["precision"]["requested"] == "auto" and summary["precision"]["resolved"] == "bf16"
    monkeypatch.setattr(precision, "probe_bf16", _no_probe)
    resumed = _trainer(tmp_path, tiny_data, "train.steps=5", resume=True)
    assert resumed.env.bf16 and "not probed again" in resumed.precision.reason
    resumed.release()  # the run folder's lock: a trainer holds it until its fit ends
    from plelab.cli import main

    before = (run / "config.json").read_bytes()
    assert main(["train", "--preset", "cpu-tiny", "--out", str(run), "--resume", "--steps", "6", "--no-progress",
                 "--set", "train.precision=fp32"]) == 2
    err = capsys.readouterr().err
    assert "trained with a different train.precision" in err and err.count("\n") == 1
    assert (run / "config.json").read_bytes() == before


def test_a_run_recorded_as_auto_before_resolution_resumes_as_fp32_on_cpu(monkeypatch, tmp_path, tiny_data):
    _flags(monkeypatch, [])
    _trainer(tmp_path, tiny_data).fit()
    run = tmp_path / "run"
    for path in [run / "config.json", *run.glob("checkpoints/*/state.json")]:  # what older runs recorded
        d = json.loads(path.read_text())
        (d["config"] if "config" in d else d)["train"]["precision"] = "auto"
        path.write_text(json.dumps(d))
    resumed = _trainer(tmp_path, tiny_data, "train.steps=5", resume=True)
    assert resumed.precision.resolved == "fp32" and resumed.step == 3


TRAIN = ["train", "--preset", "cpu-tiny", "--steps", "12", "--no-progress", "--set", "train.precision=bf16",
         "--set", "train.checkpoint_every=4", "--set", "train.eval_every=6", "--set", "train.warmup_steps=2"]


def _run(out: Path, *extra: str, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PLELAB_FAULT"}
    if fault:
        env["PLELAB_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "plelab", *TRAIN, "--out", str(out), *extra],
                          capture_output=True, text=True, env=env, timeout=300)


def _rows(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("tokens_per_second", "mfu")} for r in rows]


@pytest.mark.slow
def test_bf16_training_is_deterministic_and_a_kill_9_resume_is_bit_identical(tmp_path):
    ref = tmp_path / "ref"
    assert _run(ref).returncode == 0
    killed = tmp_path / "killed"
    assert _run(killed, fault="after_step:7").returncode == -9
    resumed = _run(killed, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "step-000004" in resumed.stdout
    assert _rows(killed) == _rows(ref)  # the first 7 steps ran in another process: determinism, then resume
    assert json.loads((ref / "summary.json").read_text())["precision"]["resolved"] == "bf16"


def test_attention_stays_fp32_under_cpu_autocast(monkeypatch):
    seen = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda q, k, v, **kw: seen.append(q.dtype) or sdpa(q, k, v, **kw))
    cfg = resolve_config("cpu-tiny")
    model = build_model(cfg.model, cfg.ple)
    x = torch.randint(0, 512, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    assert seen == [torch.float32] * cfg.model.num_hidden_layers and out.logits.dtype == torch.bfloat16


@pytest.mark.parametrize("dp", [0, 16])
def test_the_chunked_head_loss_equals_the_plain_one(dp):
    cfg = resolve_config("cpu-tiny", dp=dp)
    model = build_model(cfg.model, cfg.ple, seed=1)
    x = torch.randint(0, 512, (4, 1100 // 4 + 1), generator=torch.Generator().manual_seed(0))  # 1100 rows: 3 chunks
    targets, labels = x[:, 1:].clone(), x[:, :-1].clone()
    targets[0, :5] = labels[0, 1:6] = -100  # ignored positions
    for kw in (dict(targets=targets), dict(labels=labels)):
        results = []
        for return_logits in (True, False):
            model.zero_grad()
            out = model(x[:, :-1], **kw, return_logits=return_logits)
            out.loss.backward()
            results.append((out, {n: p.grad.clone() for n, p in model.named_parameters()}))
        (plain, g_plain), (chunked, g_chunked) = results
        assert chunked.logits is None and plain.logits.shape == (4, x.shape[1] - 1, 512)
        assert chunked.loss.dtype == torch.float32
        assert chunked.loss.item() == pytest.approx(plain.loss.item(), abs=2e-6)
        for name in g_plain:
            assert torch.allclose(g_chunked[name], g_plain[name], atol=1e-7, rtol=1e-4), name


def test_window_losses_through_the_chunked_head_equal_the_logits_path():
    from plelab.model.losses import window_losses

    cfg = resolve_config("cpu-tiny", dp=16)
    model = build_model(cfg.model, cfg.ple, seed=2)
    windows = torch.randint(0, 512, (6, 65), generator=torch.Generator().manual_seed(3))
    got = window_losses(model, windows, 4, CPU)
    with torch.no_grad():
        logits = model(windows[:, :-1]).logits
        want = F.cross_entropy(logits.transpose(1, 2), windows[:, 1:], reduction="none").mean(1).double()
    assert got.shape == (6,) and torch.allclose(got, want, atol=2e-6, rtol=0)


def test_a_run_is_evaluated_in_its_recorded_precision_except_emulated_bf16(monkeypatch):
    from plelab.training import run_precision
    cfg = resolve_config("cpu-tiny", ["train.precision=bf16"])
    cpu = torch.device("cpu")
    monkeypatch.setattr(run_precision, "cpu_bf16_flags", lambda: ())
    assert run_precision.eval_precision(cfg, cpu) == "fp32"  # emulated bf16 would be ≈ 8× slower
    assert run_precision.eval_precision(cfg, torch.device("cuda")) == "bf16"
    monkeypatch.setattr(run_precision, "cpu_bf16_flags", lambda: ("avx512_bf16",))
    assert run_precision.eval_precision(cfg, cpu) == "bf16"
    for recorded in ("fp32", "auto"):  # a run from before precision was resolved recorded auto: fp32 on a CPU
        assert run_precision.eval_precision(resolve_config("cpu-tiny", [f"train.precision={recorded}"]), cpu) == "fp32"
