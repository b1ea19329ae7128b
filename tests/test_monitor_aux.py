"""plelab.Monitor on the table family's other kinds: value embeddings, a hashed n-gram table, token modulation —
attached to an HF decoder (attach_table) or in plelab's own model — and `plelab diagnose` on what it wrote."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from hf_models import hf_trainer_monitored, monitored_loop, tiny_host, windows

import plelab
from plelab.cli import main
from plelab.config.aux_schema import AuxConfig
from plelab.errors import PlelabError
from plelab.integrations.hf_aux import KINDS, attach_table
from plelab.model.transformer import AUX_ATTRIBUTES

KEYS = {"value": "model.value_embeddings.embed.weight", "ngram": "model.ngram_embedding.embed.weight",
        "modulation": "model.token_modulation.embed.weight"}


def train_monitored(out, kind: str, seed: int = 0, steps: int = 6, w0: str = "auto"):
    """A plain loop over a Llama with a ``kind`` table attached (native init: a table that is not all zero), with a
    Monitor; returns (model, monitor, the ids trained on, the table at step 0, rows written)."""
    model = attach_table(tiny_host(), kind, init="native", seed=seed)
    start = getattr(model.model, AUX_ATTRIBUTES[kind]).embed.weight.detach().clone()
    data = windows(100 + seed, 4 * steps)
    with plelab.Monitor(model, out, every=2, checkpoint_every=steps, val_windows=windows(7, 8), w0=w0) as monitor:
        rows = monitored_loop(model, monitor, data)
    return model, monitor, data, start, rows


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_is_monitored_with_exact_row_counts_and_its_own_w0(tmp_path, kind):
    model, monitor, data, start, rows = train_monitored(tmp_path, kind)
    saved = json.loads((tmp_path / "monitor.json").read_text())
    assert saved["kind"] == kind and saved["table_key"] == KEYS[kind]
    rows_, layers, dim = saved["shape"]
    assert rows_ * layers * dim == start.numel() and saved["hidden_size"] == 32
    # the rows the table looked up in training, exactly: token ids, or the n-gram table's hash buckets
    keys = model.model.ngram_embedding.ngram_ids(data) if kind == "ngram" else data
    expected = np.bincount(keys.reshape(-1).numpy(), minlength=rows_)
    assert np.array_equal(monitor.rows.counts.numpy(), expected)
    # W_0 regenerated from attach_table's seed equals the table as it was before the first step
    assert torch.equal(monitor.w0(), start) and "attach_table seed" in saved["w0"]
    assert [r["step"] for r in rows if r] == [2, 4, 6]
    diag = rows[-1]["diag"]
    assert diag["table_grad_norm"] > 0 and 0 < diag["rows_touched"] <= 1
    assert monitor.scalars()["plelab/table_grad_norm"] == diag["table_grad_norm"]
    ckpt = json.loads((tmp_path / "checkpoints" / "step-000006" / "diagnostics.json").read_text())
    assert ckpt["rows_used"] == int((expected > 0).sum()) and len(ckpt["layers"]) == layers
    assert ckpt["use"]["permute"]["windows"] == 8 and ckpt["use_verdict"] in ("USED", "UNUSED", "UNDECIDED")
    hooks = [m for m in model.modules() if any(h == monitor._count_lookup for h in m._forward_hooks.values())]
    assert hooks == []  # close() took its hook off


def test_a_snapshot_w0_is_the_table_at_construction(tmp_path):
    _, auto, _, start, _ = train_monitored(tmp_path / "a", "value", steps=2)
    _, snap, _, _, _ = train_monitored(tmp_path / "b", "value", steps=2, w0="snapshot")
    assert torch.equal(auto.w0(), snap.w0()) and torch.equal(snap.w0(), start)
    assert "snapshot" in json.loads((tmp_path / "b" / "monitor.json").read_text())["w0"]


def test_diagnose_reads_a_monitored_value_table(tmp_path):
    train_monitored(tmp_path / "s0", "value", seed=0, steps=8)
    train_monitored(tmp_path / "s1", "value", seed=1, steps=8)
    assert main(["diagnose", str(tmp_path / "s0"), "--reference", str(tmp_path / "s1"), "--out",
                 str(tmp_path / "d"), "--no-progress"]) == 0
    report = json.loads((tmp_path / "d" / "diagnostics.json").read_text())
    assert report["step"] == 8 and report["rows"]["used"] > 0
    assert report["table"]["cross_seed"]["cka"] is not None and report["table"]["use"]["permute"]["windows"] == 8
    assert report["table"]["verdict"]["use"] in ("USED", "UNUSED", "UNDECIDED")
    assert any("run by plelab.Monitor" in n for n in report["notes"])
    assert "table kind: value vs PLE" in json.dumps(report["reliability"])  # the range check knows its kind


def test_monitor_on_plelabs_own_model_with_an_ngram_table(tmp_path, tiny_cfg):
    ac = AuxConfig(kind="ngram", rows=1031)
    model = plelab.build_model(tiny_cfg.model, replace(tiny_cfg.ple, dim=0), seed=0, ac=ac)
    monitor = plelab.Monitor(model, tmp_path, every=1)
    ids = torch.randint(0, tiny_cfg.model.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
    model(ids, labels=ids).loss.backward()
    row = monitor.step(0)
    buckets = model.model.ngram_embedding.ngram_ids(ids)
    assert np.array_equal(monitor.rows.counts.numpy(), np.bincount(buckets.reshape(-1).numpy(), minlength=1031))
    grad = model.model.ngram_embedding.embed.weight.grad
    assert row["diag"]["table_grad_norm"] == pytest.approx(float(grad.norm())) and "snr" not in row["diag"]
    # plelab's own model records no attach_table seed: W_0 is the snapshot
    assert "snapshot" in json.loads((tmp_path / "monitor.json").read_text())["w0"]
    monitor.close()


def test_a_model_without_a_table_is_one_line(tmp_path):
    with pytest.raises(PlelabError) as err:
        plelab.Monitor(tiny_host(), tmp_path)
    assert "needs a model with a token-indexed table" in str(err.value) and "\n" not in str(err.value)
    assert not any(tmp_path.iterdir())


def test_hf_trainer_callback_monitors_an_attached_ngram_table(tmp_path):
    model = attach_table(tiny_host(), "ngram", init="native")
    rows = hf_trainer_monitored(model, tmp_path / "mon")
    assert [r["step"] for r in rows if "diag" in r] == [2, 4]
    assert all(r["diag"]["table_grad_norm"] > 0 for r in rows if "diag" in r)
    saved = json.loads((tmp_path / "mon" / "checkpoints" / "step-000004" / "diagnostics.json").read_text())
    assert saved["use"]["permute"]["windows"] == 4
    assert not model.model.ngram_embedding.embed._forward_hooks  # on_train_end closed the monitor
