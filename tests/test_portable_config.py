"""Portable configs (issue 53 item 7): a run records its path-like keys absolute in config.json, so
`plelab train --config runs/a/config.json --seed 1` works from another directory, and a sweep's sweep.json and its
report's "Reproduce" line name the same files (and the sweep folder) from anywhere."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest

from plelab.cli import main
from plelab.config import resolve_config
from plelab.config.paths import path_keys, portable, portable_mapping, portable_override
from plelab.data import load_corpus
from plelab.sweeps.commands import dp_spec
from plelab.sweeps.spec import load_spec, save_spec


@pytest.fixture
def places(tmp_path):
    a, b = tmp_path / "A", tmp_path / "B"
    a.mkdir()
    b.mkdir()
    docs = load_corpus(None).documents[:300]
    (a / "corpus.txt").write_text("\n\n".join(docs))
    return a.resolve(), b.resolve()


def test_the_path_like_keys_are_tagged_in_the_schema_and_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert set(path_keys()) == {"data.path", "data.mix", "data.tokenizer", "data.ood", "visual.data",
                                "model.hf_config"}
    # data.ood names a built-in set or a file: the name is kept, a file made absolute
    assert portable_override("data.ood=other-libraries") == "data.ood=other-libraries"
    assert portable_override("data.ood=held/out.txt") == f"data.ood={Path.cwd()}/held/out.txt"
    here = str(Path.cwd())
    assert portable_override("data.path=c.txt") == f"data.path={here}/c.txt"
    assert portable_override(" data.mix = a.txt:0.7,sub/:0.3") == f"data.mix={here}/a.txt:0.7,{here}/sub:0.3"
    for unchanged in ("data.path=none", "data.path=/abs/c.txt", "train.lr=0.1", "data.text_field=body"):
        assert portable_override(unchanged) == unchanged
    assert portable_mapping({"data": {"tokenizer": "t.json", "path": None}, "seed": 1}) == {
        "data": {"tokenizer": f"{here}/t.json", "path": None}, "seed": 1}
    cfg = resolve_config("cpu-tiny", ["data.mix=a.txt:1,b.txt:2", "data.tokenizer=tok.json", "visual.data=v.jsonl"])
    assert cfg.data.mix == [f"{here}/a.txt:1", f"{here}/b.txt:2"] and cfg.data.tokenizer == f"{here}/tok.json"
    assert cfg.visual.data == f"{here}/v.jsonl" and portable(cfg) == cfg


def test_a_runs_config_works_from_another_directory(places, monkeypatch):
    a, b = places
    monkeypatch.chdir(a)
    assert main(["train", "--preset", "cpu-tiny", "--steps", "2", "--data", "corpus.txt", "--out", "runs/a",
                 "--no-progress"]) == 0
    saved = json.loads((a / "runs/a/config.json").read_text())
    assert saved["data"]["path"] == str(a / "corpus.txt")  # absolute, not the typed "corpus.txt"
    summary = json.loads((a / "runs/a/summary.json").read_text())
    assert summary["config"]["data"]["path"] == str(a / "corpus.txt")
    monkeypatch.chdir(b)
    assert main(["train", "--config", "../A/runs/a/config.json", "--seed", "1", "--out", "b", "--no-progress"]) == 0
    again = json.loads((b / "b/config.json").read_text())
    assert again["data"]["path"] == str(a / "corpus.txt") and again["seed"] == 1
    assert main(["train", "--preset", "cpu-tiny", "--steps", "2", "--data", "../A/corpus.txt", "--tokenizer",
                 "../A/runs/a/tokenizer.json", "--out", "c", "--no-progress"]) == 0
    third = json.loads((b / "c/config.json").read_text())["data"]
    assert third["tokenizer"] == str(a / "runs/a/tokenizer.json") and third["path"] == str(a / "corpus.txt")
    assert ".." not in third["tokenizer"]


def test_a_sweeps_reproduce_line_runs_from_anywhere(places, monkeypatch):
    a, b = places
    monkeypatch.chdir(a)
    argv = ["sweep", "--preset", "cpu-tiny", "--dp", "0,4", "--seeds", "1", "--steps", "2", "--data", "corpus.txt",
            "--set", "train.eval_every=1", "--out", "sw", "--no-progress"]
    assert main(argv) == 0
    spec = load_spec(a / "sw")
    assert f"data.path={a / 'corpus.txt'}" in spec.overrides
    run = json.loads((a / "sw/runs/dp4/seed-0/config.json").read_text())
    assert run["data"]["path"] == str(a / "corpus.txt")
    text = (a / "sw/report/report.md").read_text()
    line = re.search(r"Reproduce or resume: `([^`]*)`", text).group(1)
    assert f"--out {a / 'sw'}" in line and str(a / "corpus.txt") in line
    monkeypatch.chdir(b)
    assert main([*shlex.split(line)[1:], "--no-report", "--no-progress"]) == 0  # the same sweep, found complete
    assert not (b / "sw").exists() and os.listdir(b) == []


def test_a_sweep_that_recorded_a_relative_path_continues_as_typed(places, monkeypatch):
    a, _ = places
    monkeypatch.chdir(a)
    save_spec(a / "old", dp_spec(preset="cpu-tiny", dp=[0, 4], seeds=1, steps=2, data="corpus.txt"))  # as before
    assert "data.path=corpus.txt" in load_spec(a / "old").overrides
    assert main(["sweep", "--preset", "cpu-tiny", "--dp", "0,4", "--seeds", "1", "--steps", "2", "--data",
                 "corpus.txt", "--out", "old", "--emit", "torchrun"]) == 0
    assert "data.path=corpus.txt" in load_spec(a / "old").overrides  # not refused as another definition
