"""The sweep engine: pairing, resume after a kill, growth, cluster scripts, report, advise, demo."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_sweeps import TINY, tiny_spec

import plelab
from plelab.cli import main
from plelab.config import resolve_config
from plelab.data.tokens import PackedSampler
from plelab.errors import PlelabError
from plelab.model.init import build_model
from plelab.sweeps.runner import jobs_of, run_config, run_state, run_sweep
from plelab.sweeps.spec import SweepSpec, dp_arms, load_spec, merge_spec
from plelab.training.optim import optimizer_groups

_spec = tiny_spec


def test_pairing_same_trunk_and_data_order_across_arms(tiny_data):
    spec = _spec()
    c0, c16, c16m, other = (run_config(spec, spec.arm(a), s) for a, s in
                            (("dp0", 1), ("dp16", 1), ("dp16-frozen", 1), ("dp0", 0)))
    models = [build_model(c.model, c.ple, seed=c.seed) for c in (c0, c16, c16m, other)]
    trunk = {n: p for n, p in models[0].named_parameters()}
    for m in models[1:3]:
        for name, p in m.named_parameters():
            if name in trunk:
                assert torch.equal(p, trunk[name]), name
    assert not torch.equal(models[3].model.embed_tokens.weight, trunk["model.embed_tokens.weight"])
    batches = [PackedSampler(tiny_data.train, c.train.seq_len, c.seed).batch(7, c.train.batch_size)[0]
               for c in (c0, c16, other)]
    assert torch.equal(batches[0], batches[1]) and not torch.equal(batches[0], batches[2])


def test_a_runs_config_is_the_base_plus_typed_deltas_equal_to_resolving_afresh(tmp_path, monkeypatch):
    """The sweep resolves its base once and applies each arm's overrides as typed values: every arm's config at
    every seed equals preset + every override text resolved from scratch (paths included), and the base is
    resolved once per spec."""
    from plelab.sweeps import configs
    from plelab.training.run_precision import with_precision
    monkeypatch.chdir(tmp_path)
    variants = {"wide": ["model.intermediate_size=96", "ple.vocab_size=200", "ple.vocab_remap=frequency"], "lr": ["train.lr=0.0031"]}
    arms = dp_arms([0, 8, 16], list(plelab.sweeps.spec.CONTROLS[:-2]), variants=variants)
    spec = _spec(arms=arms, seeds=[0, 5])
    spec.overrides = [*spec.overrides, "data.tokenizer=relative-tok.json", "train.early_checkpoint=2"]
    calls = []
    real = configs.resolve_config
    monkeypatch.setattr(configs, "resolve_config", lambda *a, **k: calls.append(a) or real(*a, **k))
    for arm in spec.arms:
        for seed in spec.seeds:
            fresh = resolve_config(spec.preset, [*spec.overrides, *arm.overrides], seed=seed, steps=spec.steps)
            fresh = with_precision(fresh, "fp32") if fresh.train.precision == "auto" else fresh
            assert run_config(spec, arm, seed, "fp32").to_dict() == fresh.to_dict(), (arm.name, seed)
    assert len(calls) == 1
    assert run_config(spec, spec.arm("dp8"), 0).data.tokenizer == str(tmp_path / "relative-tok.json")
    spec.steps = 3  # a changed spec is resolved again
    assert run_config(spec, spec.arm("dp8"), 0).train.steps == 3 and len(calls) == 2


def test_controls_change_only_what_they_claim(tiny_data):
    spec = _spec(arms=dp_arms([0, 16], ["frozen", "zero", "iid", "matched", "table-lr", "boost"]))
    names = [a.name for a in spec.arms]
    assert names == ["dp0", "dp16", "dp16-frozen", "dp16-zero", "dp16-iid", "dp16-matched", "dp16-tablelr-third",
                     "dp16-tablelr-x3", "dp16-boost"]

    def changed(arm: str) -> dict:
        ref, ctl = (run_config(spec, spec.arm(a), 0).to_dict() for a in ("dp16", arm))
        return {f"{sec}.{k}": v for sec in ref if isinstance(ref[sec], dict)
                for k, v in ctl[sec].items() if ref[sec][k] != v}
    # each control changes exactly the keys it claims against its reference
    assert changed("dp16-iid") == {"ple.ids": "iid"} and changed("dp16-frozen") == {"ple.table": "frozen"}
    assert changed("dp16-zero") == {"ple.table": "zero"} and changed("dp16-boost") == {"ple.table_scale": 4.0}
    gates = _spec(arms=dp_arms([0, 8, 16], ["gate-scalar", "gate-vector"]))
    assert [a.name for a in gates.arms] == ["dp0", "dp8", "dp16", "dp8-gate-scalar", "dp16-gate-scalar",
                                            "dp8-gate-vector", "dp16-gate-vector"]
    for gate in ("scalar", "vector"):  # the gate and its recorded init, nothing else
        ref, ctl = (run_config(gates, gates.arm(a), 0) for a in ("dp16", f"dp16-gate-{gate}"))
        assert ctl.ple == dataclasses.replace(ref.ple, gate=gate, gate_init=1.0) and ctl.model == ref.model
        assert "ple.gate_init=1" in gates.arm(f"dp16-gate-{gate}").overrides

    assert spec.arm("dp16-matched").alias_of == "dp16"  # the reference dP: same config, not rerun
    zero = build_model(*(lambda c: (c.model, c.ple))(run_config(spec, spec.arm("dp16-zero"), 0)), seed=0)
    assert not zero.model.embed_tokens_per_layer.weight.requires_grad
    assert zero.model.embed_tokens_per_layer.weight.abs().sum() == 0
    boost = run_config(spec, spec.arm("dp16-boost"), 0)
    assert boost.ple.embed_scale == pytest.approx(4 * 16 ** 0.5)
    lr = run_config(spec, spec.arm("dp16-tablelr-third"), 0)
    assert lr.train.table_lr_mult == pytest.approx(1 / 3, rel=1e-5)
    groups = {g["name"]: g["lr"] for g in optimizer_groups(build_model(lr.model, lr.ple, seed=0), lr.train)}
    assert groups["ple_table"] == pytest.approx(groups["decay"] / 3, rel=1e-5)
    matched = run_config(_spec(arms=dp_arms([0, 8, 32], ["matched"])), dp_arms([0, 8, 32], ["matched"])[-1], 0)
    assert matched.ple.dim == 32 and matched.ple.embed_scale == pytest.approx(8 ** 0.5)


def test_trunk_controls_spend_what_ple_adds_on_a_wider_ffn():
    from plelab.model.accounting import closed_form_counts, flops_per_token
    from plelab.sweeps.commands import dp_spec

    spec = dp_spec(preset="cpu-sweep", dp=[0, 8, 32], controls=["trunk-params", "trunk-flops"], control_dp=32)
    cfgs = {a.name: run_config(spec, a, 0) for a in spec.arms}
    assert set(cfgs) == {"dp0", "dp8", "dp32", "dp32-trunk-params", "dp32-trunk-flops"}
    params = {k: sum(closed_form_counts(c.model, c.ple).values()) for k, c in cfgs.items()}
    flops = {k: flops_per_token(c.model, c.ple, c.train.seq_len) for k, c in cfgs.items()}
    H, L = cfgs["dp0"].model.hidden_size, cfgs["dp0"].model.num_hidden_layers
    assert abs(params["dp32-trunk-params"] - params["dp32"]) <= 3 * H * L / 2  # the nearest whole FFN width
    assert abs(flops["dp32-trunk-flops"] - flops["dp32"]) <= 18 * H * L / 2
    for name, c in cfgs.items():  # no PLE, only the FFN wider; everything else as the baseline
        if name.startswith("dp32-trunk"):
            assert not c.ple.enabled and c.model.intermediate_size > cfgs["dp0"].model.intermediate_size
            assert dataclasses.replace(c.model, intermediate_size=1) == dataclasses.replace(cfgs["dp0"].model,
                                                                                            intermediate_size=1)
            assert spec.arm(name).reference == "dp32"


@pytest.mark.slow
def test_frozen_table_is_not_trained(sweep_dir):
    from safetensors.torch import load_file

    from plelab.diagnostics.live import initial_table

    run = sweep_dir / "runs" / "dp16-frozen" / "seed-0"
    cfg = run_config(_spec(), _spec().arm("dp16-frozen"), 0)
    w = load_file(str(run / "checkpoints" / "step-000030" / "model.safetensors"))
    assert torch.equal(w["model.embed_tokens_per_layer.weight"], initial_table(cfg))
    assert (run / "checkpoints" / "step-000010").is_dir()  # the early checkpoint is kept


@pytest.mark.slow
def test_sweep_results_report_and_advise(sweep_dir, capsys):
    assert main(["report", str(sweep_dir)]) == 0
    rep = sweep_dir / "report"
    html = (rep / "report.html").read_text()
    assert "data:image/png;base64," in html and "http://" not in html and "https://" not in html
    md = (rep / "report.md").read_text()
    for text in ("## Findings", "Results in the seed's format", "dp16-matched", "Does the early verdict",
                 "tokens per table row", "How this grid maps", "Token budget: a speed-up or added capacity?",
                 "The seed's mechanism: does the gate stay shut below some dP?"):
        assert text in md
    number = r"([0-9.e-]+)"
    gemma = re.search(rf"^\| dp8 \| gemma \| — \| {number} \| — \| {number} \| {number} \| {number} \| — \| — \| — \|$",
                      md, re.M)
    assert gemma and all(float(x) > 0 for x in gemma.groups())  # read from the runs' live diagnostics
    data = json.loads((rep / "results.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    rows = {r["arm"]: r for r in data["analysis"]["rows"]}
    assert rows["dp8-matched"]["vs_baseline"] == rows["dp8"]["vs_baseline"]  # an alias is its reference arm
    assert rows["dp16"]["added_params"] == data["accounting"]["dp16"]["added"] > 0
    assert rows["dp8"]["n"] == 2 and rows["dp16-matched"]["n"] == 2
    early = data["analysis"]["early_vs_final"]
    assert len(data["analysis"]["consecutive"]) == 2 and early["n"] == 6  # learned tables only: dp8, dp16, dp16-matched
    assert early["n_vs_zero"] == 6 and all(r["vs_zero"] is not None for r in early["rows"])
    assert len((rep / "results.csv").read_text().splitlines()) == 1 + len(rows)
    assert {p.name for p in (rep / "plots").iterdir()} >= {"loss_vs_dp.png", "loss_vs_params.png", "paired_delta.png",
                                                          "diagnostics_vs_dp.png", "loss_curves.png",
                                                          "token_budget.png"}
    budget = data["analysis"]["token_budget"]
    assert set(budget) == {"dp8", "dp16"} and all(len(e["curve"]) >= 2 and e["label"] for e in budget.values())
    capsys.readouterr()
    assert main(["advise", str(sweep_dir)]) == 0
    assert "Recommendation: dP =" in capsys.readouterr().out
    assert main(["advise", str(sweep_dir), "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["status"] == "recommended" and answer["recommendation"] in answer["measured"]
    advice = plelab.advise(sweep_dir)  # Python: the same answer, structured
    assert advice.recommendation == answer["recommendation"] and "Recommendation: dP =" in advice.text()
    assert main(["advise", str(sweep_dir), "--dp", "64"]) == 2
    assert "refusing to extrapolate" in capsys.readouterr().err
    assert main(["advise", str(sweep_dir), "--preset", "gpu-125m"]) == 2
    err = capsys.readouterr().err
    assert "refusing to extrapolate" in err and "model.hidden_size" in err and err.count("\n") == 1


@pytest.mark.slow
def test_the_real_sweeps_findings_map_to_their_sources(sweep_dir):
    from test_sweep_stats import check_findings_map_to_their_sources

    from plelab.stats.analysis import analyse
    from plelab.sweeps.results import collect, regime

    res = collect(sweep_dir)
    assert check_findings_map_to_their_sources(res, analyse(res), regime(res)) >= 5


@pytest.mark.slow
def test_plan_sizes_a_confirmatory_sweep_on_fresh_seeds(sweep_dir, capsys):
    from plelab.stats.planning import plan

    p = plan(sweep_dir, delta=0.05, eval_windows=4)
    spec_seeds = set(p["pilot_seeds"])
    assert [r["fraction"] for r in p["noise"]["by_run_length"]] == [0.25, 0.5, 0.75, 1.0]
    assert [r["windows"] for r in p["noise"]["by_eval_windows"]][1] == 4
    assert all(r["median_sd"] > 0 for r in p["noise"]["by_eval_windows"] + p["noise"]["by_run_length"])
    assert p["delta_origin"] == "given with --delta" and p["chosen_last_k"] in (1, 2, 3, 5)
    assert {e["last_k"] for e in p["by_last_k"]} >= {1, 2, 3}
    fam = next(e for e in p["by_last_k"] if e["last_k"] == p["chosen_last_k"])["families"]["consecutive"]
    assert len(fam["comparisons"]) == 2 and all(r["sd"] > 0 for r in fam["comparisons"])
    assert p["seeds"]  # at δ = 0.05 the tiny sweep's noise is decidable within 1000 seeds
    assert not spec_seeds & set(p["confirmatory_seeds"]) and len(p["confirmatory_seeds"]) == p["seeds"]
    assert "--seed-list" in p["command"] and "--delta 0.05" in p["command"]
    # one number per question: the plan at the pilot's own outcome and δ gives what the pilot's report gives
    from plelab.reports.sweep_findings import required_seeds
    from plelab.stats.analysis import analyse
    from plelab.sweeps.results import collect

    res = collect(sweep_dir, structure=False)
    res.spec = dataclasses.replace(res.spec, delta=0.05)
    same = {k: p["seeds_at_pilot_outcome"][k] for k in ("consecutive", "vs_baseline")}
    assert same == required_seeds(analyse(res), res.spec.alpha) and all(v for v in same.values())
    capsys.readouterr()
    assert main(["plan", str(sweep_dir), "--delta", "0.05"]) == 0
    assert "not fitted on the pilot" in capsys.readouterr().out
    assert main(["plan", str(sweep_dir), "--power", "1.5"]) == 2
    assert "--power must be between 0 and 1" in capsys.readouterr().err
    assert main(["plan", str(sweep_dir), "--delta", "0.1", "--delta-fraction", "0.5"]) == 2
    assert "not both" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None and shutil.which("google-chrome") is None,
                    reason="headless Chromium not installed (apt-get install chromium)")
def test_report_renders_in_headless_chromium(sweep_dir, tmp_path):
    if not (sweep_dir / "report" / "report.html").exists():
        main(["report", str(sweep_dir)])
    script = Path(__file__).resolve().parents[1] / "scripts" / "check_report_render.py"
    proc = subprocess.run([sys.executable, str(script), str(sweep_dir / "report" / "report.html"),
                           "--png", str(tmp_path / "shot.png")], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("ok:")
    blank = tmp_path / "blank.html"
    blank.write_text("<html><body></body></html>")
    proc = subprocess.run([sys.executable, str(script), str(blank)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 1 and "BLANK" in proc.stdout


@pytest.mark.slow
def test_sweep_resumes_after_kill_and_never_redoes_a_run(tmp_path, tiny_data):
    root = tmp_path / "sw"
    cmd = [sys.executable, "-m", "plelab", "sweep", "--preset", "cpu-tiny", "--dp", "0,8", "--seeds", "2",
           "--steps", "20", "--out", str(root), "--no-report", "--no-progress",
           "--set", "train.checkpoint_every=10", "--set", "train.eval_every=10", "--set", "train.diag_windows=0"]
    killed = subprocess.run(cmd, env={**os.environ, "PLELAB_FAULT": "after_step:15"}, capture_output=True, text=True)
    assert killed.returncode == -9
    first = root / "runs" / "dp0" / "seed-0"
    # the early checkpoint (a quarter of the steps, for the early verdict) and the periodic one
    assert sorted(p.name for p in (first / "checkpoints").iterdir()) == ["step-000005", "step-000010"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "0 already done, 4 to run" in done.stdout
    for run in (root / "runs").glob("*/seed-*"):
        steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
        assert steps == list(range(1, 21)), run
    stamps = {p: p.stat().st_mtime_ns for p in root.glob("runs/*/seed-*/summary.json")}
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode == 0 and "4 already done, 0 to run" in again.stdout
    assert stamps == {p: p.stat().st_mtime_ns for p in root.glob("runs/*/seed-*/summary.json")}
    # killed after its final checkpoint but before its summary: the rerun only writes the summary
    (first / "summary.json").unlink()
    metrics = (first / "metrics.jsonl").read_text()
    last = subprocess.run(cmd, capture_output=True, text=True)
    assert last.returncode == 0 and "3 already done, 1 to run" in last.stdout
    assert (first / "summary.json").exists() and (first / "metrics.jsonl").read_text() == metrics
    assert main(["sweep", *cmd[cmd.index("--preset"):], "--emit", "torchrun"]) == 2  # nothing left to emit


def test_sweep_grows_but_refuses_changed_definitions(tmp_path):
    root = tmp_path / "g"
    spec = _spec(arms=dp_arms([0, 8]))
    merged = merge_spec(root, spec)
    from plelab.sweeps.spec import save_spec

    save_spec(root, merged)
    grown = merge_spec(root, _spec(arms=dp_arms([0, 8, 16]), seeds=[0, 1, 2]))
    assert [a.name for a in grown.arms] == ["dp0", "dp8", "dp16"] and grown.seeds == [0, 1, 2]
    changed = _spec(arms=dp_arms([0, 8]))
    changed.arms[1].overrides = ["ple.dim=8", "ple.gate=scalar"]
    with pytest.raises(PlelabError, match="arm dp8"):
        merge_spec(root, changed)
    with pytest.raises(PlelabError, match="steps"):
        merge_spec(root, _spec(arms=dp_arms([0, 8]), steps=99))


def test_emit_torchrun_and_slurm(tmp_path, capsys):
    root = tmp_path / "e"
    base = ["sweep", "--preset", "cpu-tiny", "--dp", "0,8", "--seeds", "2", "--steps", "4", "--out", str(root)]
    assert main([*base, "--emit", "torchrun"]) == 0
    lines = [x for x in (root / "commands.sh").read_text().splitlines() if x.startswith("torchrun")]
    assert len(lines) == 4 and all("-m plelab train --out" in x and "--resume" in x for x in lines)
    assert main([*base, "--emit", "slurm"]) == 0
    sbatch = (root / "sweep.sbatch").read_text()
    assert "#SBATCH --array=0-3" in sbatch and sbatch.count("'torchrun --standalone") == 4
    # the emitted command is plain `plelab train --out RUN --resume` on the pre-written config
    run = root / "runs" / "dp8" / "seed-1"
    assert main(["train", "--out", str(run), "--resume", "--no-progress"]) == 0
    spec = load_spec(root)
    assert "train.early_checkpoint=1" in spec.overrides  # the early verdict at a quarter of the steps
    states = {j.name: run_state(j) for j in jobs_of(root, spec)}
    assert states["dp8/seed-1"] == "done" and states["dp0/seed-0"] == "new"


@pytest.mark.slow
def test_emit_multi_node(tmp_path, capsys):
    """--nodes N: a Slurm array of N-node runs, and torchrun lines whose c10d rendezvous really starts a run."""
    root = tmp_path / "m"
    base = ["sweep", "--preset", "cpu-tiny", "--dp", "0,8", "--seeds", "1", "--steps", "2", "--out", str(root)]
    assert main([*base, "--nodes", "2"]) == 2
    assert "--nodes 2 needs --emit" in capsys.readouterr().err
    assert main([*base, "--emit", "slurm", "--nodes", "2"]) == 0
    sbatch = (root / "sweep.sbatch").read_text()
    assert "#SBATCH --nodes=2" in sbatch and "#SBATCH --ntasks-per-node=1" in sbatch and "srun " in sbatch
    assert sbatch.count("--rdzv_backend=c10d") == 2 and "--standalone" not in sbatch
    assert subprocess.run(["bash", "-n", str(root / "sweep.sbatch")]).returncode == 0
    assert main([*base, "--emit", "torchrun", "--nodes", "2"]) == 0
    line = [x for x in (root / "commands.sh").read_text().splitlines() if x.startswith("torchrun")][0]
    with socket.socket() as sock:  # a free port for the rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "NNODES": "1", "NPROC": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "RDZV_ID": "test", "OMP_NUM_THREADS": "1"}
    line = line.replace("torchrun ", f"{shlex.quote(sys.executable)} -m torch.distributed.run ", 1)
    proc = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sum(run_state(j) == "done" for j in jobs_of(root, load_spec(root))) == 1


def test_sweep_input_errors(tmp_path, capsys):
    cases = [
        (["sweep", "--dp", "8,16", "--out", str(tmp_path / "a")], "must include 0"),
        (["sweep", "--dp", "0,x", "--out", str(tmp_path / "a")], "invalid --dp"),
        (["sweep", "--dp", "0,8", "--controls", "nope", "--out", str(tmp_path / "a")], "unknown control"),
        (["sweep", "--dp", "0,8", "--control-dp", "4", "--controls", "boost", "--out", str(tmp_path / "a")],
         "is not one of"),
        (["sweep", "--dp", "0,8", "--variant", "bad", "--out", str(tmp_path / "a")], "invalid --variant"),
        (["sweep", "--seed", "3", "--out", str(tmp_path / "a")], "ambiguous option: --seed"),
        (["sweep", "--dp", "0,8", "--seed-list", "1,1", "--out", str(tmp_path / "a")], "repeats a seed"),
        (["sweep", "--dp", "0,8", "--variant", "frozen:ple.gate=scalar", "--out", str(tmp_path / "a")],
         "taken by a built-in"),
        (["report", str(tmp_path / "nothing")], "not a plelab sweep"),
        (["advise", str(tmp_path)], "not a plelab sweep"),
    ]
    for argv, needle in cases:
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse's own errors exit from the parser
            code = exit_.code
        assert code == 2, argv
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1 and "Traceback" not in err, (argv, err)
    assert not (tmp_path / "a").exists()


def test_report_needs_the_baseline(tmp_path, capsys):
    root = tmp_path / "b"
    spec = SweepSpec(preset="cpu-tiny", overrides=list(TINY), arms=dp_arms([0, 8]), seeds=[0], steps=12)
    run_sweep(root, spec, progress=False, log=lambda *a: None)
    shutil.rmtree(root / "runs" / "dp0")
    shutil.rmtree(root / "records" / "dp0")  # a run's record keeps it finished without its folder
    assert main(["report", str(root)]) == 2
    err = capsys.readouterr().err
    assert "baseline dp0 has no finished run" in err and err.count("\n") == 1


@pytest.mark.slow
def test_demo_quick_writes_the_report(tmp_path, capsys, tiny_data):
    assert main(["demo", "--quick", "--out", str(tmp_path / "d"), "--no-progress", "--jobs", "1",
                 "--precision", "fp32"]) == 0
    out = capsys.readouterr().out
    for part in ("d", "d/visual"):  # --precision reaches both studies' definitions and every run
        assert "train.precision=fp32" in json.loads((tmp_path / part / "sweep.json").read_text())["overrides"]
    recorded = {json.loads(c.read_text())["train"]["precision"] for c in tmp_path.glob("d/**/seed-*/config.json")}
    assert recorded == {"fp32"}
    assert "precision fp32 — train.precision=fp32 in the config" in out
    assert "estimated runtime" in out and "sweep wall time" in out and "; none left)" in out
    assert "2,458,421,760" in out and "882,983,168" in out and "unigram entropy" in out
    assert "Findings" in out and "Report:" in out
    assert (tmp_path / "d" / "report" / "report.html").exists()
    assert len(list((tmp_path / "d" / "runs").glob("*/seed-*/summary.json"))) == 9
    assert "Visual findings" in out and "The visual next-token fix" in out and "Visual report:" in out
    assert len(list((tmp_path / "d" / "visual" / "runs").glob("*/seed-*/summary.json"))) == 10  # 5 arms × 2 seeds
    gate = out.split("Visual findings", 1)[1].split("\n- ", 2)[1]  # random joins the oracle: the gate comes first
    assert gate.startswith(("**Positive control passed**", "**UNINFORMATIVE**"))
    assert "The seed's dead zone was its first step" in out and "does not sample that step" in out  # cpu-tiny


def test_sweep_command_reproduces_the_spec(tmp_path):
    import shlex

    from plelab.cli import build_parser
    from plelab.sweeps.commands import dp_spec_from_args
    from plelab.sweeps.spec import sweep_command

    argv = ["sweep", "--preset", "cpu-tiny", "--dp", "0,8,16", "--controls", "frozen,boost", "--control-dp", "8",
            "--variant", "sc:ple.gate=scalar", "--steps", "20", "--set", "train.lr=0.002", "--seed-list", "0,2",
            "--delta", "0.05", "--out", str(tmp_path / "my sweep")]
    spec = dp_spec_from_args(build_parser().parse_args(argv))
    line = sweep_command(spec, tmp_path / "my sweep")
    again = dp_spec_from_args(build_parser().parse_args(shlex.split(line)[1:]))
    assert again.to_dict() == spec.to_dict()
    grown = dp_spec_from_args(build_parser().parse_args(shlex.split(sweep_command(spec, tmp_path, seeds=5))[1:]))
    assert grown.seeds == [0, 1, 2, 3, 4] and [a.name for a in grown.arms] == [a.name for a in spec.arms]


def test_a_long_sweep_probes_its_rate_before_it_starts(tmp_path, monkeypatch):
    from types import SimpleNamespace

    import plelab.sweeps.eta as eta
    from plelab.model.accounting import flops_per_token

    def clock(cfg, n=2, device="cpu"):
        jobs = [SimpleNamespace(name=f"r{i}", path=tmp_path / f"r{i}", cfg=cfg) for i in range(n)]
        return eta.SweepClock(jobs, set(), workers=2, threads=1, device=device, cores=2, overhead=0)

    long = resolve_config("cpu-tiny", ["train.steps=1000000", "ple.vocab_size=64", "ple.vocab_remap=frequency"])
    ticks = iter(range(1000))  # every perf_counter call 0.5 s later: each probed step takes exactly 0.5 s
    monkeypatch.setattr(eta.time, "perf_counter", lambda: 0.5 * next(ticks))
    rate = eta.probe_rate(long, threads=1)
    tokens = long.train.batch_size * long.train.seq_len
    assert rate == pytest.approx(flops_per_token(long.model, long.ple, long.train.seq_len) * tokens / 0.5)
    monkeypatch.undo()
    said = []
    monkeypatch.setattr(eta, "_PROBED", {})
    probed = clock(long)
    assert probed.probe(said.append)
    assert f"probing the rate: {eta.PROBE_STEPS} training steps of each of 1 shape(s)" in said[0]
    line = probed.estimate_line()
    assert f"probed ({eta.PROBE_STEPS} training steps of" in line and "assumed" not in line
    assert 1e7 < probed.rate()[0] < 1e13  # a real measurement on this CPU, whatever it is
    short = resolve_config("cpu-tiny", ["train.steps=100"])
    visual = resolve_config("cpu-tiny", ["train.steps=1000000", "visual.enabled=true"])
    assert not clock(short).probe() and "assumed" in clock(short).estimate_line()  # seconds: not worth a probe
    assert not clock(long, device="cuda").probe() and not clock(visual).probe()  # what the probe cannot stand for
    calls = []
    monkeypatch.setattr(eta, "probe_rate", lambda cfg, threads: calls.append(cfg) or 1e9)
    again = clock(long)
    assert again.probe() and not calls and again.rate()[0] == probed.rate()[0]  # a shape is probed once a process


def test_the_probe_trains_every_arm_a_dp_study_can_hold(tmp_path):
    """The long study's clock probes one run of each shape before anything trains: every control's config
    (the iid control's table rows come apart from the tokens) must train a real step."""
    import plelab.sweeps.eta as eta
    from plelab.sweeps.commands import dp_spec

    spec = dp_spec(preset="cpu-tiny", dp=[0, 8, 16], controls="all", control_dp=8, seeds=1,
                   overrides=["ple.vocab_size=64", "ple.vocab_remap=frequency"])
    shapes = {}
    for job in jobs_of(tmp_path, spec):
        shapes.setdefault(eta.shape_key(job.cfg), job.cfg)
    assert any(c.ple.ids == "iid" for c in shapes.values()) and len(shapes) >= 8
    for cfg in shapes.values():
        assert eta.probe_rate(cfg, threads=1, steps=1) > 0
    # the other kinds' i.i.d.-keyed controls (aux.ids=iid; the n-gram table's buckets [B,T,S]): the probe crashed the
    # full calibration benchmark with --kinds at its first regime that probed one
    for kind in ("value", "ngram", "modulation"):
        cfg = resolve_config("cpu-tiny", ["ple.dim=0", f"aux.kind={kind}", "aux.ids=iid"])
        assert eta.probe_rate(cfg, threads=1, steps=1) > 0


def test_sweep_clock_keeps_a_rate_per_shape(tmp_path, monkeypatch):
    from types import SimpleNamespace

    import plelab.sweeps.eta as eta

    monkeypatch.setattr(eta, "_PROBED", {})
    small = resolve_config("cpu-tiny", ["train.steps=1000000"])
    wide = resolve_config("cpu-tiny", ["train.steps=1000000", "model.hidden_size=128"])
    seen = []

    def fake_probe(cfg, threads):
        seen.append(cfg.model.hidden_size)
        return 1e9 if cfg.model.hidden_size == 128 else 4e9
    monkeypatch.setattr(eta, "probe_rate", fake_probe)
    jobs = [SimpleNamespace(name=f"{n}{i}", path=tmp_path / n / f"seed-{i}", cfg=c)
            for n, c in (("small", small), ("wide", wide)) for i in range(2)]
    clock = eta.SweepClock(jobs, set(), workers=1, threads=1, device="cpu", cores=2, overhead=0)
    assert eta.shape_key(small) != eta.shape_key(wide)
    assert clock.probe() and sorted(seen) == [64, 128]  # each shape once
    f_small, f_wide = eta.run_flops(small), eta.run_flops(wide)
    assert clock.remaining() == pytest.approx(2 * f_small / 4e9 + 2 * f_wide / 1e9)  # each shape at its own rate
    line = clock.estimate_line()
    assert f"1.0–4.0 GFLOP/s per worker, probed ({eta.PROBE_STEPS} training steps of each of 2 shape(s)" in line
    for j in jobs[:2]:
        j.path.mkdir(parents=True)
        (j.path / "summary.json").write_text(json.dumps({"wall_seconds": f_small / 2e9}))
    grown = eta.SweepClock(jobs, {jobs[0].path, jobs[1].path}, workers=1, threads=1, device="cpu", cores=2,
                           overhead=0)  # a resumed sweep: the small shape measured at 2 GFLOP/s, the wide not
    assert grown.rate(jobs[2].path) == (pytest.approx(2e9), "pooled")  # before its probe: the other shapes' rate
    assert grown.probe() and grown.rate(jobs[2].path) == (1e9, "probed") and len(seen) == 2  # cached, not re-probed
    assert grown.remaining() == pytest.approx(2 * f_wide / 1e9)
    assert "1.0 GFLOP/s per worker, probed" in grown.estimate_line() and "assumed" not in grown.estimate_line()
    tiny = eta.SweepClock(jobs[:2], set(), workers=1, threads=1, device="cpu", cores=2, overhead=0)
    tiny.owed = {p: 1.0 for p in tiny.owed}  # seconds of work: not worth a probe
    assert not tiny.probe() and "assumed" in tiny.estimate_line()
    monkeypatch.setattr(eta, "_PROBED", {})
    capped = eta.SweepClock(jobs, set(), workers=1, threads=1, device="cpu", cores=2, overhead=0)
    assert capped.probe(most=1) and seen[2:] == [128]  # the costlier shape only...
    assert capped.rate(jobs[0].path) == (1e9, "probed elsewhere")  # ...which prices the other, not the assumption
    assert "the median probed shape's" in capped.estimate_line() and "assumed" not in capped.estimate_line()


def test_sweep_clock_states_the_runtime_from_flops_and_measured_rates(tmp_path):
    from types import SimpleNamespace

    from plelab.model.accounting import flops_per_token
    from plelab.sweeps.eta import ASSUMED_CORE_FLOPS, SweepClock, duration, run_flops

    cfg = resolve_config("cpu-tiny", ["train.steps=100", "train.eval_every=50", "train.eval_batches=2"])
    per_token, tokens = flops_per_token(cfg.model, cfg.ple, 64), 8 * 64
    assert run_flops(cfg) == per_token * 100 * tokens + per_token / 3 * 2 * 2 * tokens  # evals at 50 and 100
    jobs = [SimpleNamespace(name=f"r{i}", path=tmp_path / f"r{i}", cfg=cfg) for i in range(4)]
    for j in jobs:
        j.path.mkdir()
    fresh = SweepClock(jobs, set(), workers=2, threads=1, device="cpu", overhead=0)
    assert fresh.remaining() == pytest.approx(4 * run_flops(cfg) / (2 * ASSUMED_CORE_FLOPS))
    assert "assumed" in fresh.estimate_line() and "4 run(s)" in fresh.estimate_line()
    assert SweepClock(jobs, set(), 1, 1, "cuda", overhead=0).remaining() is None  # a GPU is never assumed
    (jobs[0].path / "summary.json").write_text(json.dumps({"wall_seconds": 30.0}))
    fresh.finished(jobs[0])  # the measured rate replaces the assumed one: 3 runs × 30 s over 2 workers
    assert fresh.remaining() == pytest.approx(45.0) and fresh.left_line() == "3 left, ≈ 45 s"
    resumed = SweepClock(jobs, {jobs[0].path}, workers=1, threads=2, device="cuda", overhead=0)
    assert resumed.remaining() == pytest.approx(90.0) and "measured on 1 finished run" in resumed.estimate_line()
    assert [duration(s) for s in (44, 600, 3900)] == ["44 s", "10 min", "1 h 05 min"]
    (jobs[1].path / "checkpoints" / "step-000050").mkdir(parents=True)  # half done: owes half its FLOPs
    half = SweepClock(jobs, set(), workers=1, threads=1, device="cpu", cores=2, overhead=0)
    assert half.remaining() == pytest.approx(3.5 * run_flops(cfg) / ASSUMED_CORE_FLOPS)
    half.finished(jobs[1], elapsed=10.0)  # watched from its checkpoint: half the FLOPs in 10 s
    assert half.rate()[0] == pytest.approx(run_flops(cfg) / 2 / 10.0)
    crowded = SweepClock(jobs, set(), workers=4, threads=1, device="cpu", cores=2, overhead=0)  # 4 workers on 2 cores
    assert crowded.remaining() == pytest.approx(3.5 * run_flops(cfg) / (2 * ASSUMED_CORE_FLOPS))
    one_by_one = SweepClock(jobs, set(), workers=2, threads=1, device="cpu", cores=2, overhead=3.0)  # in turn
    assert one_by_one.remaining([[j.path for j in jobs[:1]], [j.path for j in jobs[1:]]], [1, 2]) == pytest.approx(
        (run_flops(cfg) + 2.5 * run_flops(cfg) / 2) / ASSUMED_CORE_FLOPS + 3.0 + 3 * 3.0 / 2)  # + start-ups
    one_by_one.finished(jobs[2], elapsed=13.0)  # its 3 s of start-up are not training: the full run in 10 s
    assert one_by_one.rate()[0] == pytest.approx(run_flops(cfg) / 10.0)
