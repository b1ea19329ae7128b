"""plelab.Monitor in a plain loop, under HF Trainer and Lightning, and `plelab diagnose` on what it wrote."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hf_models import VOCAB, hf_trainer_monitored, lightning_module, monitored_loop, tiny_host, windows

import plelab
from plelab.cli import main
from plelab.errors import PlelabError


def train_monitored(out, seed=0, steps=8, w0="auto", every=2, checkpoint_every=4):
    """A plain PyTorch loop over an attached Llama, with a Monitor; returns (model, monitor, rows written)."""
    model = plelab.attach(tiny_host(), 8, seed=seed)
    with plelab.Monitor(model, out, every=every, checkpoint_every=checkpoint_every, val_windows=windows(7, 8),
                        w0=w0) as monitor:
        rows = monitored_loop(model, monitor, windows(100, 4 * steps))
    return model, monitor, rows


def test_plain_loop_writes_plelabs_formats(tmp_path):
    model, monitor, rows = train_monitored(tmp_path)
    assert [r["step"] for r in rows if r] == [2, 4, 6, 8]  # completed steps, 1-based, as plelab train counts
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [2, 4, 6, 8]
    diag = lines[-1]["diag"]
    assert len(diag["snr"]) == len(diag["grad_table"]) == len(diag["grad_trunk"]) == 2
    assert all(v > 0 for v in diag["snr"] + diag["grad_table"] + diag["grad_proj"] + diag["grad_trunk"])
    assert 0 < diag["rows_touched"] <= 1
    ckpt = tmp_path / "checkpoints" / "step-000008"
    saved = json.loads((ckpt / "diagnostics.json").read_text())
    assert saved["use"]["permute"]["windows"] == 8 and saved["use_verdict"] in ("USED", "UNUSED", "UNDECIDED")
    assert len(saved["layers"]) == 2 and saved["w0"] == "regenerated from the attach seed"
    assert not model.base_model.per_layer_embedding._forward_hooks  # close() took every hook off
    assert not (tmp_path / "w0.safetensors").exists()


def test_row_counts_are_exact_and_count_training_forwards_only(tmp_path):
    model = plelab.attach(tiny_host(), 8)
    monitor = plelab.Monitor(model, tmp_path, every=0)
    ids = windows(1, 3)
    model(ids)
    model.eval()
    model(windows(2, 5))  # an evaluation forward: not counted
    with torch.no_grad():
        model.train()
        model(windows(3, 5))  # no gradient: not a training step either
    expected = np.bincount(ids.reshape(-1).numpy(), minlength=VOCAB)
    assert np.array_equal(monitor.rows.counts.numpy(), expected)
    monitor.close()


def test_snapshot_and_regenerated_w0_agree(tmp_path):
    a = plelab.Monitor(plelab.attach(tiny_host(), 8, seed=5), tmp_path / "a", every=0)
    b = plelab.Monitor(plelab.attach(tiny_host(), 8, seed=5), tmp_path / "b", every=0, w0="snapshot")
    assert (tmp_path / "b" / "w0.safetensors").exists() and not (tmp_path / "a" / "w0.safetensors").exists()
    assert torch.equal(a.w0(), b.w0())


def test_monitor_on_plelabs_own_model(tmp_path, tiny_cfg):
    from dataclasses import replace

    cfg = replace(tiny_cfg, ple=replace(tiny_cfg.ple, dim=8))
    model = plelab.build_model(cfg.model, cfg.ple, seed=0)
    monitor = plelab.Monitor(model, tmp_path, every=1)
    ids = torch.randint(0, cfg.model.vocab_size, (2, 9))
    model(ids, labels=ids).loss.backward()
    row = monitor.step(0)
    assert len(row["diag"]["snr"]) == cfg.model.num_hidden_layers
    monitor.close()


def test_diagnose_reads_monitor_runs_like_its_own(tmp_path, capsys):
    train_monitored(tmp_path / "s0", seed=0, steps=10, checkpoint_every=10)
    train_monitored(tmp_path / "s1", seed=1, steps=10, checkpoint_every=10, w0="snapshot")
    assert main(["diagnose", str(tmp_path / "s0"), "--reference", str(tmp_path / "s1"), "--out",
                 str(tmp_path / "d"), "--no-progress"]) == 0
    report = json.loads((tmp_path / "d" / "diagnostics.json").read_text())
    assert report["step"] == 10 and report["rows"]["used"] > 0
    assert report["table"]["cross_seed"]["cka"] is not None and report["table"]["use"]["permute"]["windows"] == 8
    verdict = report["table"]["verdict"]
    reasons = " ".join(verdict["reasons"])
    assert "cross-seed CKA" in reasons and "permute rows" in reasons
    assert verdict["use"] in ("USED", "UNUSED", "UNDECIDED")
    assert verdict["structure"] in ("LEARNED", "NOT DISTINGUISHABLE FROM NULL")
    assert any("run by plelab.Monitor" in n for n in report["notes"])


def test_hf_trainer_with_the_callback(tmp_path):
    model = plelab.attach(tiny_host(), 8)
    rows = hf_trainer_monitored(model, tmp_path / "mon")
    assert [r["step"] for r in rows if "diag" in r] == [2, 4]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4] and all("learning_rate" in r for r in rows
                                                                            if "loss" in r)
    assert (tmp_path / "mon" / "checkpoints" / "step-000004" / "diagnostics.json").exists()
    assert not model.base_model.per_layer_embedding._forward_hooks  # on_train_end closed the monitor


def test_lightning_callback(tmp_path):
    lightning = pytest.importorskip("lightning", reason="lightning is not installed here (pip install lightning)")

    model = plelab.attach(tiny_host(), 8)

    monitor = plelab.Monitor(model, tmp_path, every=1)
    trainer = lightning.Trainer(max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False,
                                callbacks=[plelab.integrations.LightningCallback(monitor)])
    trainer.fit(lightning_module(lightning, model), torch.utils.data.DataLoader(windows(4, 12), batch_size=4))
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert (tmp_path / "checkpoints" / "step-000003" / "diagnostics.json").exists()  # the final verdict


BAD_MONITOR = {
    "a model without PLE": (lambda: (tiny_host(), {}), "needs a model with a token-indexed table"),
    "negative every": (lambda: (plelab.attach(tiny_host(), 8), {"every": -1}), "every must be an integer >= 0"),
    "float windows": (lambda: (plelab.attach(tiny_host(), 8), {"val_windows": torch.randn(4, 9)}),
                      "val_windows must be an integer tensor"),
    "unknown w0": (lambda: (plelab.attach(tiny_host(), 8), {"w0": "zeros"}), "w0 must be 'auto' or 'snapshot'"),
}


@pytest.mark.parametrize("case", list(BAD_MONITOR))
def test_monitor_refuses_in_one_line(case, tmp_path):
    build, needle = BAD_MONITOR[case]
    model, kwargs = build()
    with pytest.raises(PlelabError) as err:
        plelab.Monitor(model, tmp_path, **kwargs)
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert not any(tmp_path.iterdir())  # refused before writing anything


@pytest.mark.slow
def test_under_ddp_rank_0_writes_and_counts_are_summed(tmp_path):
    import os
    import shutil
    from pathlib import Path

    from safetensors import safe_open
    from torchrun_launch import torchrun

    here = Path(__file__).parent
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{here}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}

    def start_again():
        shutil.rmtree(tmp_path)
        tmp_path.mkdir()

    proc = torchrun(["--nproc_per_node=2", str(here / "ddp_monitor_script.py"), str(tmp_path)], env=env,
                    before_retry=start_again)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [2, 4]
    with safe_open(str(tmp_path / "checkpoints" / "step-000004" / "ple_table.safetensors"), framework="pt") as f:
        counts = f.get_tensor("diag.row_counts")
    ids = torch.cat([torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(100 * s + r))
                     for s in range(4) for r in range(2)])
    assert torch.equal(counts, torch.bincount(ids.reshape(-1), minlength=VOCAB))


def test_a_bf16_host_gets_bf16_ple_and_an_exact_regenerated_w0(tmp_path):
    model = plelab.attach(tiny_host().to(torch.bfloat16), 8, seed=4)
    ple = plelab.PLEModules(model)
    assert {p.dtype for p in ple.parameters()} == {torch.bfloat16}
    monitor = plelab.Monitor(model, tmp_path, every=0)
    assert torch.equal(monitor.w0(), ple.table.detach().float())  # regenerated, then rounded as attach stored it
    ids = windows(5, 2)
    model(ids, labels=ids).loss.backward()
    assert ple.table.grad is not None and ple.table.grad.dtype == torch.bfloat16
    monitor.close()


def test_an_unwritable_folder_is_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(PlelabError, match="cannot write to") as err:
        plelab.Monitor(plelab.attach(tiny_host(), 8), blocker / "mon", every=0, w0="snapshot")
    assert "\n" not in str(err.value) and blocker.read_text() == "x"
