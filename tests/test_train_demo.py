import json
import re

import numpy as np
import pytest
import torch

from plelab.cli import main
from plelab.config import resolve_config
from plelab.data import PackedSampler, split_documents, val_windows
from plelab.runs import train
from plelab.training.optim import lr_multiplier, optimizer_groups


def test_split_is_deduplicated_deterministic_and_spread():
    docs = [f"document number {i} " * 5 for i in range(400)] + ["document number 3 " * 5]
    train_docs, val_docs, dups = split_documents(docs, 0.1)
    assert dups == 1 and len(train_docs) + len(val_docs) == 400
    assert 20 <= len(val_docs) <= 60
    assert split_documents(list(reversed(docs)), 0.1)[1] == list(reversed(val_docs))
    positions = sorted(docs.index(d) for d in val_docs)
    assert positions[0] < 100 and positions[-1] > 300  # drawn across the corpus, not a tail cut


def test_packed_sampler_is_a_function_of_seed_and_step_and_covers_each_epoch(tiny_data):
    sampler = PackedSampler(tiny_data.train, 32, seed=5)
    n = sampler.num_sequences
    a = sampler.batch(10, 4)
    b = PackedSampler(tiny_data.train, 32, seed=5).batch(10, 4)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0], sampler.batch(11, 4)[0])
    assert not np.array_equal(a[0], PackedSampler(tiny_data.train, 32, seed=6).batch(10, 4)[0])
    assert np.array_equal(a[0][:, 1:], a[1][:, :-1])
    # one epoch visits every packed sequence exactly once, then a new order starts
    G = 64
    seen = np.concatenate([sampler.indices(k, G) for k in range(n // G)])
    assert len(set(seen.tolist())) == len(seen)
    first_two = np.concatenate([sampler.indices(k, G) for k in range(2 * n // G + 1)])
    assert set(first_two.tolist()) == set(range(n))
    assert sampler.epochs(n // G, G) == pytest.approx((n // G) * G / n)
    # rows of a global batch are a partition: rank slices concatenate to the whole batch
    whole = sampler.batch(3, 8)[0]
    halves = torch.cat([sampler.batch(3, 8, slice(0, 4))[0], sampler.batch(3, 8, slice(4, 8))[0]])
    assert torch.equal(whole, halves)
    w = val_windows(tiny_data.val, 32, 10)
    assert w.shape == (10, 33)


def test_optimizer_groups_partition_and_table_settings(tiny_cfg):
    from plelab.model import build_model

    tiny_cfg.train.table_lr = 0.01
    model = build_model(tiny_cfg.model, tiny_cfg.ple, device="meta")
    groups = {g["name"]: g for g in optimizer_groups(model, tiny_cfg.train)}
    assert set(groups) == {"decay", "no_decay", "ple_table"}
    assert groups["ple_table"]["params"] == [model.model.embed_tokens_per_layer.weight]
    assert groups["ple_table"]["lr"] == 0.01 and groups["ple_table"]["weight_decay"] == 0.0
    assert sum(len(g["params"]) for g in groups.values()) == len(list(model.parameters()))
    assert lr_multiplier(0, tiny_cfg.train) == pytest.approx(1 / tiny_cfg.train.warmup_steps)
    assert lr_multiplier(tiny_cfg.train.steps, tiny_cfg.train) == pytest.approx(tiny_cfg.train.min_lr_ratio)


@pytest.mark.slow
def test_training_is_deterministic_and_learns(tiny_data, tmp_path):
    cfg = resolve_config("cpu-tiny", steps=40)
    a = train(cfg, tmp_path / "a", data=tiny_data, progress=False)
    b = train(cfg, data=tiny_data, progress=False)
    assert a.train_losses == b.train_losses
    assert a.final_val_loss < a.val_history[0][1] < 6.3
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["corpus_fingerprint"] == tiny_data.corpus_fingerprint and summary["seed"] == 0
    assert summary["config"]["ple"]["dim"] == 16 and "torch" in summary["versions"]
    rows = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 40 and rows[-1]["val_loss"] == pytest.approx(a.final_val_loss)
    assert {"loss", "lr", "grad_norm", "tokens", "epoch", "tokens_per_second"} <= set(rows[0])


def test_sweep_on_user_text_and_demo_bad_data(tmp_path, capsys):
    text = tmp_path / "mine.txt"
    text.write_text("\n\n".join(f"Paragraph {i}: the quick brown fox jumps over the lazy dog {i % 7} times."
                                for i in range(3000)))
    assert main(["sweep", "--preset", "cpu-tiny", "--steps", "3", "--dp", "0,8", "--seeds", "1", "--data", str(text),
                 "--out", str(tmp_path / "r"), "--no-progress", "--set", "train.seq_len=16"]) == 0
    assert "wrote" in capsys.readouterr().out
    saved = json.loads((tmp_path / "r" / "runs" / "dp8" / "seed-0" / "config.json").read_text())
    assert saved["data"]["path"] == str(text)
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\x00\x01\x02" * 100)
    assert main(["demo", "--quick", "--data", str(binary), "--out", str(tmp_path / "x")]) == 2
    assert "looks binary" in capsys.readouterr().err
    assert main(["demo", "--quick", "--data", str(tmp_path / "missing.txt")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_train_command_on_user_text(tmp_path, capsys):
    text = tmp_path / "notes.txt"
    text.write_text("\n\n".join(f"Note {i}: layer {i % 5} reads its own table row for token {i % 11}."
                                for i in range(2000)))
    out = tmp_path / "run"
    assert main(["train", "--preset", "cpu-tiny", "--steps", "12", "--data", str(text), "--out", str(out),
                 "--no-progress", "--set", "train.seq_len=32"]) == 0
    printed = capsys.readouterr().out
    assert "validation unigram entropy" in printed and "final validation loss" in printed
    assert re.search(r"unigram entropy \d+\.\d{3} \(\d+\.\d{3} (below|above) it\)", printed)  # no signed "below"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["data"]["path"] == str(text)
    assert summary["val_unigram_entropy"] > 0 and summary["steps"] == 12
    assert len(summary["corpus_fingerprint"]) == 64 and summary["git_commit"]
    from tokenizers import Tokenizer  # the run folder carries its tokenizer: its ids mean something outside plelab

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.get_vocab_size() <= summary["config"]["model"]["vocab_size"]
    assert tok.decode(tok.encode("Note 7: layer 2 reads").ids).strip() == "Note 7: layer 2 reads"


@pytest.mark.parametrize("setting, needle", [("train.tensorboard=true", "pip install tensorboard"),
                                             ("train.wandb_project=plelab", "pip install wandb")])
def test_missing_optional_sink_fails_before_writing(tmp_path, capsys, monkeypatch, setting, needle):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("tensorboard", "wandb") else real(name, *a))
    out = tmp_path / "run"
    assert main(["train", "--preset", "cpu-tiny", "--steps", "2", "--out", str(out), "--no-progress",
                 "--set", setting]) == 2
    assert needle in capsys.readouterr().err
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.slow
def test_torch_compile_matches_eager(tiny_data):
    # fp32 pinned: under bf16 autocast (what auto picks on a CPU with bf16 units) fused and unfused kernels round
    # differently, ~1e-4 nats after 4 steps (measured on an AVX512-BF16 EPYC)
    eager = train(resolve_config("cpu-tiny", ["train.precision=fp32"], steps=4), data=tiny_data, progress=False,
                  log=lambda *a: None)
    compiled = train(resolve_config("cpu-tiny", ["train.compile=true", "train.precision=fp32"], steps=4),
                     data=tiny_data, progress=False, log=lambda *a: None)
    assert compiled.train_losses == pytest.approx(eager.train_losses, abs=1e-5)
