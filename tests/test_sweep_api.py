"""The sweep verbs from Python: ``plelab.sweep`` returns its runs and is silent without progress."""

from tiny_sweeps import TINY

import plelab
from plelab.sweeps.runner import RunJob


def test_sweep_returns_its_runs_and_is_silent_without_progress(tmp_path, capsys):
    runs = plelab.sweep(tmp_path / "s", preset="cpu-tiny", overrides=TINY, dp=[0, 8], seeds=2, steps=10,
                        progress=False)
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""
    assert len(runs) == 4 and all(isinstance(r, RunJob) for r in runs)
    assert {(r.arm.name, r.seed) for r in runs} == {("dp0", 0), ("dp0", 1), ("dp8", 0), ("dp8", 1)}
    assert all((r.path / "summary.json").exists() for r in runs)
    lines = []
    again = plelab.sweep(tmp_path / "s", preset="cpu-tiny", overrides=TINY, dp=[0, 8], seeds=2, steps=10,
                         progress=False, log=lines.append)
    assert [r.path for r in again] == [r.path for r in runs] and any("0 to run" in str(x) for x in lines)


def test_sweep_takes_the_text_field_and_tokenizer_of_its_data(tmp_path, capsys):
    import json

    from plelab.cli import main

    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"body": f"document {i} says something about tables"}) + "\n"
                            for i in range(50)))
    assert main(["sweep", "--out", str(tmp_path / "x"), "--text-field", "body", "--dp", "0,8"]) == 2
    assert "describe the text --data gives" in capsys.readouterr().err and not (tmp_path / "x").exists()
    out = tmp_path / "s"
    assert main(["sweep", "--out", str(out), "--preset", "cpu-tiny", "--data", str(data), "--text-field", "body",
                 "--dp", "0,8", "--seeds", "2", "--emit", "torchrun"]) == 0
    overrides = json.loads((out / "sweep.json").read_text())["overrides"]
    assert "data.text_field=body" in overrides and f"data.path={data}" in overrides
