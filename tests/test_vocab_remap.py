"""``ple.vocab_remap=frequency``: the Vp − 1 most frequent ids keep their own table rows, the rest share row 0."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors import safe_open

from plelab import frequency_rows, train
from plelab.config import resolve_config
from plelab.data.pipeline import prepare_token_data
from plelab.diagnostics.diagnose import row_occurrences
from plelab.errors import ConfigError
from plelab.model.init import build_model
from plelab.training.evaluate import evaluate
from plelab.training.rows import row_counts, token_rows
from plelab.training.text_task import TextTask

VP = 48
REMAP = [f"ple.vocab_size={VP}", "ple.vocab_remap=frequency"]


def test_frequency_rows_keeps_the_most_frequent_ids_apart():
    counts = torch.tensor([5, 9, 9, 0, 3, 7, 1])
    rows = frequency_rows(counts, 4)
    # ids 1 and 2 tie at 9 (the lower id first), then id 5; everything else shares the out-of-vocabulary row 0
    assert rows.tolist() == [0, 1, 2, 0, 0, 3, 0] and rows.dtype == torch.int64
    assert sorted(frequency_rows(counts, 7).tolist()) == list(range(7))  # a full table: a permutation
    with pytest.raises(ValueError, match="2 <= table_rows <= 7"):
        frequency_rows(counts, 8)


def test_config_refuses_what_a_remap_cannot_honour():
    with pytest.raises(ConfigError, match="set ple.vocab_size below model.vocab_size"):
        resolve_config("cpu-tiny", ["ple.dim=8", "ple.vocab_remap=frequency"])
    with pytest.raises(ConfigError, match="ple.vocab_remap"):
        resolve_config("cpu-tiny", ["ple.dim=8", "ple.vocab_remap=rank"])
    with pytest.raises(ConfigError, match="none in a visual run"):
        resolve_config("cpu-tiny", ["ple.dim=8", *REMAP, "visual.enabled=true"])
    cfg = resolve_config("cpu-tiny", ["ple.dim=8", *REMAP])
    with pytest.raises(ValueError, match="this config has no remap"):
        build_model(cfg.model, resolve_config("cpu-tiny", ["ple.dim=8"]).ple, token_rows=torch.zeros(512).long())
    with pytest.raises(ValueError, match=r"to a row in \[0, 48\)"):
        build_model(cfg.model, cfg.ple, token_rows=torch.full((512,), VP))
    unfilled = build_model(cfg.model, cfg.ple)  # a skeleton for a checkpoint to fill: reading it raises
    with pytest.raises(ValueError, match="unfilled"):
        unfilled(torch.zeros(1, 4, dtype=torch.long))


def test_remap_rows_and_counts(tiny_data):
    cfg = resolve_config("cpu-tiny", ["ple.dim=8", *REMAP])
    rows = token_rows(cfg, tiny_data)
    counts = tiny_data.train_counts(cfg.model.vocab_size)
    kept = np.argsort(-counts, kind="stable")[: VP - 1]
    assert sorted(rows[kept].tolist()) == list(range(1, VP))  # each frequent id its own row
    assert set(rows[np.setdiff1d(np.arange(len(counts)), kept)].tolist()) == {0}
    per_row = row_counts(cfg, tiny_data)
    assert per_row.sum() == counts.sum() and per_row[1:].tolist() == counts[kept].tolist()
    # the remap raises tokens per row without merging frequent ids: row 0 holds only the rare tail
    clip = row_counts(resolve_config("cpu-tiny", ["ple.dim=8", f"ple.vocab_size={VP}"]), tiny_data)
    assert per_row[0] < clip[0] and per_row.sum() == clip.sum()
    assert token_rows(resolve_config("cpu-tiny", ["ple.dim=8", f"ple.vocab_size={VP}"]), tiny_data) is None


def test_a_remapped_run_trains_saves_its_map_and_evaluates(tmp_path):
    cfg = resolve_config("cpu-tiny", ["ple.dim=8", *REMAP, "train.steps=6", "train.eval_every=3",
                                      "train.batch_size=4", "train.precision=fp32"])
    data = prepare_token_data(cfg, progress=False)
    rows = token_rows(cfg, data)
    out = tmp_path / "run"
    result = train(cfg, out, data=data, progress=False, log=lambda *a, **k: None)
    ckpt = out / "checkpoints" / "step-000006"
    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        assert torch.equal(f.get_tensor("model.per_layer_token_rows"), rows)
        assert f.get_tensor("model.embed_tokens_per_layer.weight").shape[0] == VP
    with safe_open(str(ckpt / "optimizer.safetensors"), "pt") as f:
        looked_up = f.get_tensor("diag.row_counts").numpy()
    # the trainer's exact row counts are the replayed sampler's ids through the same map
    assert np.array_equal(looked_up, row_occurrences(cfg, data, 6).astype(np.int64))
    assert looked_up.sum() == 6 * cfg.train.batch_size * cfg.train.seq_len and looked_up[0] > 0
    assert json.loads((out / "config.json").read_text())["ple"]["vocab_remap"] == "frequency"
    # a fresh model reads the map from the checkpoint: eval gives the run's own final validation loss
    assert evaluate(out, progress=False)["val_loss"] == pytest.approx(result.final_val_loss, abs=1e-6)
    x = TextTask(cfg, data).sampler.batch(0, cfg.train.batch_size)[0]
    assert torch.equal(build_model(cfg.model, cfg.ple, token_rows=rows).model.table_ids(x), rows[x])
