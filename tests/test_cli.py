import json
import subprocess
import sys

import pytest

from plelab.cli import main


def test_params_prints_the_seed_table(capsys):
    assert main(["params", "--preset", "seed-3b", "--dp", "0,64,128,256,512"]) == 0
    out = capsys.readouterr().out
    for s in ["2,458,421,760", "220,807,232", "441,532,544", "882,983,168", "1,765,884,416",
              "8.98%", "17.96%", "35.92%", "71.83%", "819,986,432", "20,971,776", "42,024,960"]:
        assert s in out, s


def test_params_json(capsys):
    assert main(["params", "--preset", "seed-3b", "--dp", "256", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = {r["dP"]: r for r in data["rows"]}
    assert rows[0]["total"] == 2_458_421_760
    assert rows[256]["added"] == 882_983_168
    assert (rows[256]["ple_table"], rows[256]["ple_model_projection"], rows[256]["ple_per_layer"]) == (
        819_986_432, 20_971_776, 42_024_960)
    assert rows[256]["train_flops_per_token"] > rows[0]["train_flops_per_token"]


def test_config_and_presets_commands(capsys):
    assert main(["config", "--preset", "cpu-small", "--dp", "32", "--set", "train.lr=0.001"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["ple"]["dim"] == 32 and cfg["train"]["lr"] == 0.001 and cfg["preset"] == "cpu-small"
    assert main(["presets"]) == 0
    assert "seed-3b" in capsys.readouterr().out


@pytest.mark.parametrize("argv, needle", [
    (["params", "--preset", "nope"], "unknown preset 'nope'"),
    (["params", "--dp", "64,x"], "invalid --dp"),
    (["params", "--dp", "-8"], "ple.dim=-8"),
    (["params", "--set", "model.num_attention_heads=5"], "model.num_attention_heads=5"),
    (["config", "--set", "model.nope=1"], "unknown config key 'model.nope'"),
    (["params", "--gate", "sigmoid"], "invalid choice: 'sigmoid'"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_bad_input_is_one_line_exit_2(argv, needle, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse errors exit from inside parse_args
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.slow
def test_console_entry_point_exit_code_and_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "plelab", "params", "--set", "model.vocab_size=1"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "plelab: error: invalid config value model.vocab_size=1: allowed an integer >= 2"


def test_unforeseen_file_system_error_is_one_line(monkeypatch, capsys):
    import plelab.cli as cli
    import plelab.cli.configs as configs

    def boom(args):
        raise PermissionError(13, "Permission denied", "/data/locked/file")

    monkeypatch.setattr(configs, "cmd_presets", boom)
    assert cli.main(["presets"]) == 2
    err = capsys.readouterr().err
    assert err == ("plelab: error: cannot access /data/locked/file: Permission denied; check the path, its permissions "
                   "and the free disk space, then rerun (finished work is kept)\n")


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["config"], ["params", "--dp", "0,64"]])
def test_a_closed_pipe_ends_the_output_quietly(argv):
    """``plelab config | head -1``: the reader goes before plelab has written everything — here before it writes
    anything (it is still importing), so that the pipe is closed whatever the size of the output."""
    proc = subprocess.Popen([sys.executable, "-m", "plelab", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait() == 0 and err == ""


def test_a_broken_pipe_elsewhere_is_still_an_error(monkeypatch, capsys):
    import plelab.cli.configs as configs

    def boom(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(configs, "cmd_presets", boom)
    assert main(["presets"]) == 2  # stdout (captured here) is open: the pipe that broke is another one
    err = capsys.readouterr().err
    assert err.startswith("plelab: error: a file read or write failed: Broken pipe (the system named no file); check")
    assert err.count("\n") == 1 and "cannot access:" not in err  # issue 54: never 'cannot access' without a name


def test_train_validates_the_values_of_its_flags(tmp_path, capsys):
    """Regression: --data / --text-field / --tokenizer used to be set after the config was validated."""
    out = tmp_path / "run"
    assert main(["train", "--preset", "cpu-tiny", "--steps", "2", "--no-progress", "--text-field", "",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == "plelab: error: invalid config value data.text_field='': allowed a non-empty field name\n"
    assert not out.exists()


def test_train_takes_a_config_file_and_its_config_json_back(tmp_path, capsys):
    toml = tmp_path / "tiny.toml"
    toml.write_text('preset = "cpu-tiny"\nseed = 4\n\n[ple]\ndim = 8\n\n[train]\nsteps = 3\neval_every = 3\n'
                    'checkpoint_every = 0\n')
    first = tmp_path / "a"
    assert main(["train", "--config", str(toml), "--set", "train.lr=0.002", "--no-progress", "--out", str(first)]) == 0
    saved = json.loads((first / "config.json").read_text())
    assert (saved["seed"], saved["ple"]["dim"], saved["train"]["steps"], saved["train"]["lr"]) == (4, 8, 3, 0.002)
    capsys.readouterr()
    assert main(["config", "--config", str(first / "config.json")]) == 0
    assert json.loads(capsys.readouterr().out) == saved
    assert main(["config", "--config", str(first / "config.json"), "--dp", "16", "--set", "seed=1"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert (again["ple"]["dim"], again["seed"], again["train"]["lr"]) == (16, 1, 0.002)


def test_sweep_takes_a_config_file_as_its_base(tmp_path):
    from plelab.cli import build_parser
    from plelab.sweeps.commands import dp_spec_from_args
    from plelab.sweeps.runner import run_config

    toml = tmp_path / "base.toml"
    toml.write_text('preset = "cpu-tiny"\n[model]\nhidden_size = 32\n[train]\nlr = 0.004\nsteps = 20\n')
    args = build_parser().parse_args(["sweep", "--config", str(toml), "--set", "train.lr=0.005", "--dp", "0,8",
                                      "--seeds", "2", "--out", str(tmp_path / "s")])
    spec = dp_spec_from_args(args)
    assert spec.preset == "cpu-tiny" and spec.overrides[:3] == ["model.hidden_size=32", "train.steps=20",
                                                                "train.lr=0.004"]
    cfg = run_config(spec, spec.arm("dp8"), 1)
    assert (cfg.model.hidden_size, cfg.train.lr, cfg.train.steps, cfg.ple.dim, cfg.seed) == (32, 0.005, 20, 8, 1)


def test_visual_study_takes_a_config_file_below_its_profile():
    from plelab.config import config_file_overrides, resolve_config
    from plelab.visual.study import visual_spec

    preset, base = config_file_overrides({"model": {"hidden_size": 32}, "train": {"batch_size": 4}}, None, "cpu-tiny")
    spec = visual_spec("quick", ["none", "oracle"], preset=preset, base=base, overrides=["train.lr=0.002"])
    cfg = resolve_config(spec.preset, [*spec.overrides, *spec.arm("oracle").overrides])
    # the file's hidden size stays; the quick profile's batch size (16) is the study's own; --set is on top
    assert (cfg.model.hidden_size, cfg.train.batch_size, cfg.train.lr, cfg.visual.ids) == (32, 16, 0.002, "oracle")
    assert visual_spec("quick", ["none", "oracle"]).overrides[0] == "visual.enabled=true"  # no file: as before


def test_dp_is_one_flag_of_one_type(capsys):
    """Every verb's --dp goes through the one parser: a list where several dP make sense, one integer elsewhere."""
    from plelab.cli import build_parser

    parser = build_parser()
    lists = {"params": [], "sweep": ["--out", "x"]}
    ones = {"config": [], "train": ["--out", "x"], "diagnose": ["run"], "advise": ["s"], "visual-study": []}
    for verb, rest in lists.items():
        assert parser.parse_args([verb, *rest, "--dp", "0,8"]).dp == [0, 8]
    for verb, rest in ones.items():
        assert parser.parse_args([verb, *rest, "--dp", "8"]).dp == 8
        assert main([verb, *rest, "--dp", "0,8"]) == 2
        assert capsys.readouterr().err.startswith("plelab: error: invalid --dp '0,8': give one integer, e.g. --dp 64")


def test_nothing_below_the_cli_imports_argparse():
    import re
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "plelab"
    users = [str(p.relative_to(package)) for p in package.rglob("*.py")
             if "cli" not in p.relative_to(package).parts and re.search(r"^\s*(import|from) argparse\b", p.read_text(),
                                                                         re.M)]
    assert users == []


def test_the_verb_table_is_what_the_groups_register():
    """``plelab.cli.VERBS`` (which module main() imports for a verb) agrees with the groups' own parsers, in help's
    order."""
    import importlib

    from plelab.cli import GROUPS, VERBS, build_parser
    from plelab.cli.common import Parser

    for group in GROUPS:
        sub = Parser(prog="x").add_subparsers(parser_class=Parser)
        importlib.import_module(f"plelab.cli.{group}").add_parsers(sub)
        assert sorted(sub.choices) == sorted(v for v, g in VERBS.items() if g == group), group
    full = next(a for a in build_parser()._actions if a.dest == "command")
    assert list(full.choices) == list(VERBS)
    for verb in VERBS:
        assert list(next(a for a in build_parser(verb)._actions if a.dest == "command").choices) == \
            [v for v, g in VERBS.items() if g == VERBS[verb]]


def test_a_training_worker_starts_without_the_study_wings():
    """A sweep starts each run as ``plelab train``: that verb imports its own group only, never the statistics,
    the reports of studies, calibration or the visual kind (each start is ≈ 1 s of CPU less); a sweep start loads
    no scipy until a fit or a statistic needs it."""
    code = ("import sys; from plelab.cli import main\n"
            "try:\n    main(['train', '--help'])\nexcept SystemExit:\n    pass\n"
            "wings = ('plelab.visual', 'plelab.stats', 'plelab.scaling', 'plelab.calibration', 'plelab.reports.sweep',"
            " 'plelab.sweeps', 'scipy', 'statsmodels')\n"
            "print('LOADED', sorted(m for m in sys.modules if m.startswith(wings)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "LOADED []"
    sweep = code.replace("'train'", "'sweep'").replace("wings = (", "wings = ('scipy', 'statsmodels', ")
    out = subprocess.run([sys.executable, "-c", sweep], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1].startswith("LOADED [") and "scipy" not in out.splitlines()[-1]  # fits load it
    presets = "import sys; from plelab.cli import main; main(['presets']); print(sorted(sys.modules))"
    assert "plelab.integrations.hosts" in subprocess.run(  # trunks are registered for every verb
        [sys.executable, "-c", presets], capture_output=True, text=True, check=True).stdout


def test_sweep_help_names_every_control_it_accepts(capsys):
    """The --controls help is built from the controls the spec accepts, so a new control cannot go unlisted."""
    from plelab.sweeps.spec import CONTROLS

    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    listed = text.rsplit("--controls CONTROLS ", 1)[1].split("--control-dp", 1)[0].replace("- ", "-")
    assert all(c in listed for c in CONTROLS), listed
