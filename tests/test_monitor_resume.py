"""The Monitor under a host trainer that stops and resumes: the final verdict at the last step, row counts that
continue across HF ``resume_from_checkpoint`` and Lightning ``ckpt_path`` (never restart), the host's loss and
learning rate in metrics.jsonl, the Monitor's scalars in what report_to loggers receive, and a warning when the
optimizer decays the table."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from hf_models import VOCAB, lightning_module, tiny_host
from safetensors import safe_open

import plelab
from plelab.errors import PlelabError


def windows(seed: int, n: int, t: int = 13) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, t), generator=torch.Generator().manual_seed(seed))


def counts_at(folder) -> np.ndarray:
    with safe_open(str(folder / "ple_table.safetensors"), framework="pt") as f:
        return f.get_tensor("diag.row_counts").numpy()


def hf_run(tmp_path, name, max_steps, resume=None, extra_callbacks=()):
    from transformers import Trainer, TrainingArguments

    torch.manual_seed(0)
    model = plelab.attach(tiny_host(), 8, seed=0)
    data = [{"input_ids": w, "labels": w} for w in windows(3, 4 * 7)]
    monitor = plelab.Monitor(model, tmp_path / name / "mon", every=2, checkpoint_every=4, val_windows=windows(7, 4))
    args = TrainingArguments(output_dir=str(tmp_path / name / "hf"), per_device_train_batch_size=4,
                             max_steps=max_steps, learning_rate=1e-2, report_to=[], save_strategy="steps",
                             save_steps=3, use_cpu=True, logging_steps=1, disable_tqdm=True, seed=0,
                             dataloader_drop_last=True)
    opt = plelab.adamw(plelab.param_groups(model, lr=1e-2))
    trainer = Trainer(model=model, args=args, train_dataset=data, optimizers=(opt, None),
                      callbacks=list(extra_callbacks))
    plelab.integrations.HFTrainerCallback(monitor).install(trainer)
    trainer.train(resume_from_checkpoint=resume)
    return tmp_path / name


def test_hf_trainer_resumes_the_counts_and_ends_with_a_verdict(tmp_path):
    from transformers import TrainerCallback

    seen = []

    class Logger(TrainerCallback):  # stands for a report_to integration: it runs after the installed monitor
        def on_log(self, args, state, control, logs=None, **kwargs):
            seen.append(dict(logs or {}))

    whole = hf_run(tmp_path, "whole", 7, extra_callbacks=[Logger()])
    final = whole / "mon" / "checkpoints" / "step-000007"  # checkpoint_every=4: step 7 only as the final verdict
    assert (final / "diagnostics.json").exists() and (whole / "mon" / "checkpoints" / "step-000004").exists()
    assert (whole / "hf" / "checkpoint-3" / "plelab_monitor.safetensors").exists()
    assert [i for i, logs in enumerate(seen) if "plelab/snr" in logs and "plelab/rows_touched" in logs] == [1, 3, 5]
    # the same run stopped after step 3 and resumed from its checkpoint: the same counts, never restarted
    part = tmp_path / "part"
    shutil.copytree(whole / "hf" / "checkpoint-3", part / "hf" / "checkpoint-3")
    resumed = hf_run(tmp_path, "part", 7, resume=str(part / "hf" / "checkpoint-3"))
    assert np.array_equal(counts_at(resumed / "mon" / "checkpoints" / "step-000007"), counts_at(final))
    assert counts_at(final).sum() == 7 * 4 * 13  # 7 steps of 4 windows of 13 ids
    rows = [json.loads(x) for x in (resumed / "mon" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "diag" in r] == [4, 6] and min(r["step"] for r in rows) == 4


def test_hf_resume_from_a_checkpoint_without_the_monitors_state_is_refused(tmp_path):
    whole = hf_run(tmp_path, "whole", 3)
    (whole / "hf" / "checkpoint-3" / "plelab_monitor.safetensors").unlink()
    with pytest.raises(PlelabError, match="saved without the plelab Monitor's state"):
        hf_run(tmp_path, "again", 5, resume=str(whole / "hf" / "checkpoint-3"))


def test_a_decayed_table_is_warned_about(tmp_path):
    model = plelab.attach(tiny_host(), 8)
    monitor = plelab.Monitor(model, tmp_path, every=0)
    with pytest.warns(UserWarning, match="decays the PLE table"):
        assert monitor.check_optimizer(torch.optim.AdamW(model.parameters(), weight_decay=0.1)) == 0.1
    assert monitor.check_optimizer(plelab.adamw(plelab.param_groups(model, lr=1e-3))) == 0.0
    monitor.close()


def test_lightning_resume_keeps_the_counts(tmp_path):
    lightning = pytest.importorskip("lightning", reason="lightning is not installed here (pip install lightning)")

    def fit(name, max_steps, ckpt_path=None):
        torch.manual_seed(0)
        model = plelab.attach(tiny_host(), 8, seed=0)

        monitor = plelab.Monitor(model, tmp_path / name, every=0)
        saver = lightning.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / name / "ckpt", every_n_train_steps=2,
                                                            save_top_k=-1)
        trainer = lightning.Trainer(max_steps=max_steps, accelerator="cpu", logger=False, enable_progress_bar=False,
                                    enable_model_summary=False,
                                    callbacks=[plelab.integrations.LightningCallback(monitor), saver])
        loader = torch.utils.data.DataLoader(windows(4, 8), batch_size=4)  # 2 steps an epoch: resumes at its end
        trainer.fit(lightning_module(lightning, model), loader, ckpt_path=ckpt_path)
        return tmp_path / name

    whole = fit("whole", 4)
    ckpt = next((whole / "ckpt").glob("*step=2*.ckpt"))
    resumed = fit("resumed", 4, ckpt_path=str(ckpt))
    final = counts_at(whole / "checkpoints" / "step-000004")
    assert final.sum() == 4 * 4 * 13
    assert np.array_equal(counts_at(resumed / "checkpoints" / "step-000004"), final)
