"""A size budget checked before allocating (issue 54 item 7): a table, vocabulary or consolidation that cannot fit
is refused in one line with the bytes it would need and a way forward, before any data, model or tensor is made."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import plelab
import plelab.config.budget as budget
from plelab.cli import main
from plelab.config import resolve_config
from plelab.errors import ConfigError
from plelab.runs import check_budget
from plelab.training.checkpoint import FORMAT

GB16 = (16 * 10**9, "physical memory")


def _refused(capsys, argv, *needles):
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


def test_the_estimate_and_the_memory_it_is_compared_with():
    cfg = resolve_config("cpu-tiny", ["ple.dim=2000000"])
    parts = budget.run_parts(cfg)
    assert parts["per-layer table"] == 512 * 2 * 2_000_000 * 16 and parts["embeddings"] == 512 * 64 * 16
    assert parts["per-layer inputs"] == 8 * 64 * 2 * 2_000_000 * 4 * 2
    frozen = budget.run_parts(resolve_config("cpu-tiny", ["ple.dim=2000000", "ple.table=frozen"]))
    assert frozen["per-layer table"] == parts["per-layer table"] // 4  # no gradient or AdamW state
    limit, what = budget.host_memory()
    assert 0 < limit <= 2**62 and what
    budget.check_run_budget(resolve_config("cpu-tiny"))  # the presets fit


def test_a_huge_dp_is_refused_before_anything_is_made(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(budget, "host_memory", lambda: GB16)
    out = tmp_path / "run"
    err = _refused(capsys, ["train", "--preset", "cpu-tiny", "--set", "ple.dim=2000000", "--out", str(out),
                            "--no-progress"], "needs at least", "bytes", "per-layer table 32.8 GB",
                   "more than physical memory holds (16.0 GB)", "lower ple.dim (≤ ", "would fit")
    fits = int(err.split("lower ple.dim (≤ ")[1].split(" ")[0].replace(",", ""))
    budget.check_run_budget(resolve_config("cpu-tiny", [f"ple.dim={fits}"]), GB16)  # the number named fits
    with pytest.raises(ConfigError):
        budget.check_run_budget(resolve_config("cpu-tiny", [f"ple.dim={fits * 11 // 10}"]), GB16)
    assert not out.exists()


def test_a_config_file_with_dp_1e9_and_a_huge_vocabulary_are_refused_anywhere(tmp_path, capsys):
    config = tmp_path / "big.json"
    config.write_text(json.dumps({"preset": "cpu-tiny", "ple": {"dim": 10**9}}))
    _refused(capsys, ["train", "--config", str(config), "--out", str(tmp_path / "a"), "--no-progress"],
             "needs at least", "per-layer table", "lower ple.dim")
    _refused(capsys, ["train", "--preset", "cpu-tiny", "--set", "model.vocab_size=4000000000", "--out",
                      str(tmp_path / "b"), "--no-progress"], "embeddings", "bytes", "lower model.vocab_size")
    cfg = resolve_config("cpu-tiny", ["ple.dim=1000000000"])
    with pytest.raises(ConfigError, match="needs at least"):  # the Python API refuses too
        plelab.train(cfg, tmp_path / "c", progress=False)
    assert not any((tmp_path / n).exists() for n in "abc")


def test_ingest_refuses_a_vocabulary_its_bpe_cannot_reach(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("some text to train a tokenizer on\n" * 50)
    _refused(capsys, ["ingest", "--data", str(text), "--set", "model.vocab_size=4000000000", "--no-progress"],
             "model.vocab_size=4,000,000,000 cannot be reached by a BPE", "lower model.vocab_size")
    shards = tmp_path / "ids.npy"  # token shards train no BPE: their id range is theirs to choose
    np.save(shards, np.arange(3000, dtype=np.uint16))
    check_budget(resolve_config("cpu-tiny", [f"data.path={shards}", "data.tokenizer_sample_chars=1000",
                                             "model.vocab_size=3000"]), model=False)
    with pytest.raises(ConfigError, match="cannot be reached by a BPE"):
        check_budget(resolve_config("cpu-tiny", [f"data.path={text}", "data.tokenizer_sample_chars=1000",
                                                 "model.vocab_size=3000"]), model=False)


def _sharded(root, offset: int):
    """A one-shard checkpoint of one tensor [4, 8] whose metadata puts its rows at ``offset``."""
    ckpt = root / "checkpoints" / "step-000001"
    shard = ckpt / "sharded" / "model" / "shard-00001-model-00001-of-00001.safetensors"
    shard.parent.mkdir(parents=True)
    info = json.dumps({"w": {"saved_offsets": [offset, 0]}})
    save_file({"w": torch.arange(32.0).view(4, 8)}, str(shard), metadata={"DCP_SHARDING_INFO": info})
    files = {str(p.relative_to(ckpt)): p.stat().st_size for p in sorted(ckpt.rglob("*")) if p.is_file()}
    (ckpt / "state.json").write_text(json.dumps({"format": FORMAT, "step": 1, "storage": "sharded", "files": files}))
    return ckpt


def test_consolidate_refuses_claimed_sizes_before_allocating(tmp_path, capsys, monkeypatch):
    bad = _sharded(tmp_path / "bad", 10**8)  # a 300-byte shard claiming rows at 10^8
    empty, memory = torch.empty, budget.host_memory
    monkeypatch.setattr(torch, "empty", lambda *a, **k: pytest.fail("allocated"))
    _refused(capsys, ["consolidate", str(bad)], "hold 32 of the 800,000,032 elements", "3.2 GB to allocate",
             "consolidate an earlier checkpoint")
    assert not (bad / "model.safetensors").exists()
    good = _sharded(tmp_path / "good", 0)
    monkeypatch.setattr(budget, "host_memory", lambda: (100, "physical memory"))
    _refused(capsys, ["consolidate", str(good)], "needs 0.0 GB (128 bytes), more than physical memory holds")
    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(budget, "host_memory", memory)
    assert main(["consolidate", str(good)]) == 0 and (good / "model.safetensors").exists()
