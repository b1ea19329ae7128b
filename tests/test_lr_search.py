"""The per-arm learning-rate search: one rate per arm group, on seeds kept apart, carried into the study's arms."""

from __future__ import annotations

import json

import pytest

from plelab.cli import main
from plelab.errors import ConfigError, PlelabError
from plelab.sweeps.commands import dp_spec
from plelab.sweeps.lr_search import groups, lr_spec, read_choice
from plelab.sweeps.spec import load_spec

STUDY = ["--preset", "cpu-tiny", "--dp", "0,8,16", "--controls", "zero", "--steps", "20",
         "--set", "train.eval_every=10", "--set", "train.diag_every=0", "--set", "train.early_checkpoint=0"]


def test_the_search_has_one_representative_per_group_and_refuses_the_studys_seeds():
    study = dp_spec(preset="cpu-tiny", dp=[0, 8, 16, 32], controls=["zero", "gate-scalar-small"], seeds=3)
    reps = groups(study)
    assert {g: a.name for g, a in reps.items()} == {"baseline": "dp0", "dP": "dp16", "zero": "dp16-zero",
                                                    "gate-scalar-small": "dp16-gate-scalar-small"}
    spec = lr_spec(study, [0.5, 1, 2], [1000])
    assert spec.kind == "lr" and spec.baseline == "dp0-lr1" and len(spec.arms) == 12
    lrs = {a.name: a.overrides[-1] for a in spec.arms if a.family == "dP"}
    assert lrs == {"dp16-lr0.5": "train.lr=0.0015", "dp16-lr1": "train.lr=0.003", "dp16-lr2": "train.lr=0.006"}
    with pytest.raises(ConfigError, match=r"uses seed\(s\) \[2\] of the study"):
        lr_spec(study, [0.5, 1, 2], [2, 1000])
    with pytest.raises(ConfigError, match="must include 1"):
        lr_spec(study, [0.5, 2], [1000])
    with pytest.raises(ConfigError, match="--at-dp 5 is not one of"):
        lr_spec(study, [0.5, 1], [1000], at_dp=5)


@pytest.mark.slow
def test_the_chosen_rates_reach_every_arm_of_the_study_and_stay_on_resume(tmp_path, capsys):
    search, study = tmp_path / "lr", tmp_path / "study"
    assert main(["lr-search", *STUDY, "--lr-mults", "0.5,1,4", "--search-seeds", "1000", "--out", str(search),
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "Learning rate per group" in out and "--lr-from" in out
    choice = json.loads((search / "lr.json").read_text())
    assert set(choice["groups"]) == {"baseline", "dP", "zero"} and choice["seeds"] == [1000]
    for g in choice["groups"].values():  # the chosen multiplier is the one with the lowest mean loss
        assert g["losses"][f"{g['best']:g}"] == min(g["losses"].values())
        assert g["edge"] == (g["best"] in (0.5, 4.0))
    lrs = read_choice(search)
    assert main(["sweep", *STUDY, "--seeds", "2", "--lr-from", str(search), "--emit", "torchrun",
                 "--out", str(study)]) == 0
    spec = load_spec(study)
    for arm in spec.arms:
        group = "baseline" if arm.name == "dp0" else arm.family
        assert f"train.lr={lrs[group]:.6g}" in arm.overrides
        cfg = json.loads((study / "runs" / arm.name / "seed-0" / "config.json").read_text())
        assert cfg["train"]["lr"] == pytest.approx(lrs[group])
    assert main(["sweep", *STUDY, "--seeds", "2", "--emit", "torchrun", "--out", str(study)]) == 0  # resumed
    assert load_spec(study).arms == spec.arms
    # the study's command line names the choice it read, so that it reproduces in a fresh folder too
    from plelab.sweeps.spec import sweep_command

    assert f"--lr-from {search.resolve()}" in sweep_command(load_spec(study), study)
    assert main(["report", str(search)]) == 0 and (search / "lr.md").exists()


def test_a_damaged_choice_is_refused_in_one_line(tmp_path):
    (tmp_path / "lr.json").write_text("{not json")
    with pytest.raises(PlelabError, match="is not a finished learning-rate search"):
        read_choice(tmp_path)
    with pytest.raises(ConfigError, match="not both"):
        dp_spec(preset="cpu-tiny", dp=[0, 8], lr_from=str(tmp_path), lrs={"baseline": 1e-3})


def test_a_variant_with_its_own_learning_rate_is_not_a_chosen_rate(tmp_path):
    from plelab.sweeps.spec import merge_spec, save_spec

    root = tmp_path / "v"
    spec = dp_spec(preset="cpu-tiny", dp=[0, 8], variants={"fast": ["train.lr=0.01"]})
    save_spec(root, merge_spec(root, spec))
    again = dp_spec(preset="cpu-tiny", dp=[0, 8], variants={"fast": ["train.lr=0.01"]}, existing=load_spec(root))
    assert [a.overrides for a in again.arms] == [a.overrides for a in spec.arms]  # resumed as it was made
