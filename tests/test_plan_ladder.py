"""``plelab plan --target``: the scale ladder, checked against numbers worked out by hand."""

import json
import shlex

import pytest

from plelab.cli import build_parser, main
from plelab.config import get_preset, resolve_config
from plelab.errors import ConfigError
from plelab.scaling.ladder import Assumptions, ladder


def test_seed_3b_target_rung_by_hand():
    p = ladder("seed-3b", 400e9)
    top = p["rungs"][-1]
    assert top["target"] and top["hidden_size"] == 2560 and top["dP"] == 256
    assert top["params_total"] == 2_458_421_760                       # the seed's base count
    assert top["params_total"] + top["ple_added"] == 3_341_404_928    # with the dP = 256 table
    assert p["tokens_per_parameter"] == pytest.approx(162.7060, abs=1e-4)  # 400e9 / 2,458,421,760
    assert round(top["tokens_per_table_row"]) == 3_996_164            # 400e9 / 100,096
    # 6·N_matmul + 12·L·n_heads·head_dim·T: N_matmul = attention 503,316,480 + MLP 1,698,693,120 + head
    # 256,245,760 + PLE 20,971,520 + 41,943,040; attention term 12·32·20·128·4096 = 4,026,531,840
    assert top["train_flops"] == pytest.approx(19_153_551_360 * 400e9, rel=1e-12)
    assert top["gpu_hours"] == pytest.approx(19_153_551_360 * 400e9 / (0.4 * 989e12) / 3600, rel=1e-12)  # ≈ 5,380
    # dense table, FSDP over 8: 16 B × 3,341,404,928 / 8, plus 32 × (34·4096·2560 + 8·4096·256) activation bytes
    assert top["device_memory_bytes"]["dense"] == 16 * 3_341_404_928 / 8 + 32 * (34 * 4096 * 2560 + 8 * 4096 * 256)
    # row-sparse: DDP, so the trunk is replicated; table weights + moments only (12 B)
    trunk = 3_341_404_928 - 819_986_432
    assert top["device_memory_bytes"]["row-sparse"] == 16 * trunk + 12 * 819_986_432 + 32 * (34 * 4096 * 2560
                                                                                           + 8 * 4096 * 256)


def test_the_ladder_holds_its_ratios_and_its_commands_resolve():
    p = ladder("seed-3b", 400e9)
    assert [r["hidden_size"] for r in p["rungs"]] == [160, 320, 640, 1280, 2560]
    bottom = p["rungs"][0]
    assert (bottom["head_dim"], bottom["num_hidden_layers"], bottom["vocab_size"], bottom["dP"]) == (8, 2, 6272, 16)
    assert bottom["runs_on"].startswith("cpu") and p["cpu_affordable"] == [160]
    for r in p["rungs"]:
        assert r["tokens_per_parameter"] == pytest.approx(p["tokens_per_parameter"])
        assert r["dP_over_H"] == pytest.approx(0.1) and r["H_over_L"] == pytest.approx(80)
        argv = shlex.split(r["command"])[1:]
        args = build_parser().parse_args(argv)
        cfg = resolve_config(args.preset, args.overrides)   # every --set is a valid config
        assert cfg.model.hidden_size == r["hidden_size"] and cfg.ple.enabled
        assert "--emit" in argv or r["runs_on"].startswith("cpu")
    fixed = ladder("seed-3b", 400e9, depth="fixed", vocab="fixed", count="non-embedding")
    assert all(r["num_hidden_layers"] == 32 and r["vocab_size"] == 100_096 for r in fixed["rungs"])
    assert fixed["tokens_per_parameter"] == pytest.approx(400e9 / 2_202_176_000)
    assert fixed["cpu_affordable"] == [] and any("no rung trains within" in n for n in fixed["notes"])
    assert "ple.vocab_remap=frequency" in fixed["notes"][0]  # the lever the drifting tokens per row can pull


def test_gemma_3n_tables_by_hand():
    for name, layers in (("gemma3n-e2b", 30), ("gemma3n-e4b", 35)):
        top = ladder(name, 1e12, vocab="fixed")["rungs"][-1]
        assert top["table_rows"] == 262_144 and top["num_hidden_layers"] == layers
        table = 262_144 * layers * 256                                  # 2,013,265,920 (E2B), 2,348,810,240 (E4B)
        projection = 2048 * layers * 256 + 256
        per_layer = layers * (2 * 2048 * 256 + 2048)
        assert top["ple_added"] == table + projection + per_layer
        assert top["tokens_per_table_row"] == pytest.approx(1e12 / 262_144)


def test_impossible_targets_are_one_line_errors(capsys):
    for tokens in (0, -5, float("nan")):
        with pytest.raises(ConfigError, match="--tokens must be a positive number"):
            ladder("seed-3b", tokens)
    off = get_preset("seed-3b")
    off.ple.dim = 0
    with pytest.raises(ConfigError, match="has no per-layer table"):
        ladder(off, 1e9)
    with pytest.raises(ConfigError, match="unknown --gpu"):
        ladder("seed-3b", 1e9, Assumptions(gpu="v100"))
    for argv, needle in ((["plan", "--target", "seed-3b", "--tokens", "1e9", "--gpu", "v100"], "invalid choice"),
                         (["plan", "--target", "seed-3b"], "--target needs --tokens"),
                         (["plan"], "not both or neither"),
                         (["plan", "--target", "nope", "--tokens", "1e9"], "unknown preset 'nope'"),
                         (["plan", "--target", "seed-3b", "--tokens", "1e9", "--delta", "0.1"],
                          "belongs to the pilot")):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and needle in err, err


def test_plan_json_and_text(capsys):
    assert main(["plan", "--target", "gpu-125m", "--tokens", "2.5e9", "--json"]) == 0
    p = json.loads(capsys.readouterr().out)
    assert [r["hidden_size"] for r in p["rungs"]] == [192, 384, 768] and p["rungs"][-1]["target"]
    assert main(["plan", "--target", "seed-3b", "--tokens", "4e11"]) == 0
    out = capsys.readouterr().out
    assert "162.7 tokens per parameter" in out and "Commands:" in out and "runs/ladder-H160" in out


def test_the_findings_show_the_ladder_plan_prints(capsys):
    from pathlib import Path

    findings = (Path(__file__).resolve().parents[1] / "studies" / "FINDINGS.md").read_text()
    assert main(["plan", "--target", "seed-3b", "--tokens", "400e9"]) == 0
    table = capsys.readouterr().out.splitlines()[2:8]
    assert "\n".join(table) in findings
