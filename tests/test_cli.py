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


def test_console_entry_point_exit_code_and_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "plelab", "params", "--set", "model.vocab_size=1"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "plelab: error: invalid config value model.vocab_size=1: allowed an integer >= 2"


def test_unforeseen_file_system_error_is_one_line(monkeypatch, capsys):
    import plelab.cli as cli

    def boom(args):
        raise PermissionError(13, "Permission denied", "/data/locked/file")

    monkeypatch.setattr(cli, "cmd_presets", boom)
    assert cli.main(["presets"]) == 2
    err = capsys.readouterr().err
    assert err == ("plelab: error: cannot access /data/locked/file: Permission denied; check the path, its permissions "
                   "and the free disk space, then rerun (finished work is kept)\n")
