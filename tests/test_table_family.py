"""The table family in plelab's decoder (aux.kind = value / ngram / modulation): a start equal to the trunk, exact
cached decoding, exact accounting, parameter groups, training, resume bit-identical, and the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import plelab
from plelab.cli import main
from plelab.config import resolve_config
from plelab.errors import ConfigError, PlelabError
from plelab.model.accounting import account
from plelab.model.generate import KVCache
from plelab.model.init import build_model
from plelab.model.ngram import ngram_rows
from plelab.training.optim import optimizer_groups

KINDS = ("value", "ngram", "modulation")
ROOTS = {"value": "model.value_embeddings.", "ngram": "model.ngram_embedding.",
         "modulation": "model.token_modulation."}


def _cfg(kind: str, *sets: str):
    return resolve_config("cpu-tiny", [f"aux.kind={kind}", *sets], dp=0)


@pytest.mark.parametrize("kind", KINDS)
def test_a_kind_starts_as_its_trunk_then_changes_it_and_decodes_with_a_cache_exactly(kind):
    trunk_cfg = resolve_config("cpu-tiny", dp=0)
    trunk = build_model(trunk_cfg.model, trunk_cfg.ple, seed=3)
    cfg = _cfg(kind)
    model = build_model(cfg.model, cfg.ple, seed=3, ac=cfg.aux)
    ids = torch.randint(0, cfg.model.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, trunk(ids).logits)  # function-preserving: exactly the trunk
        added = [(n, p) for n, p in model.named_parameters() if n.startswith(ROOTS[kind])]
        assert added and {n for n, _ in model.named_parameters()} - {n for n, _ in added} == \
            {n for n, _ in trunk.named_parameters()}
        for _, p in added:  # a trained table: the term is live
            p.normal_(0, 0.3, generator=torch.Generator().manual_seed(1))
        full = model(ids).logits
        assert (full - trunk(ids).logits).abs().max() > 1e-3
        cache = KVCache()
        step = [model(ids[:, :5], past_key_values=cache).logits]
        step += [model(ids[:, t:t + 1], past_key_values=cache).logits for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(step, dim=1), full, rtol=1e-5, atol=1e-5)


def test_native_inits_are_the_sources_and_seeded_by_name():
    for kind in KINDS:
        a, b = (build_model((c := _cfg(kind, "aux.init=native")).model, c.ple, seed=s, ac=c.aux) for s in (0, 0))
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    value = build_model((c := _cfg("value", "aux.init=native")).model, c.ple, seed=0, ac=c.aux).model
    table = value.value_embeddings.embed.weight
    bound = 3 ** 0.5 * c.model.hidden_size ** -0.5  # nanochat: uniform ±√3·n_embd^-½
    assert table.abs().max() <= bound and table.abs().max() > 0.9 * bound
    ngram = build_model((c := _cfg("ngram", "aux.init=native")).model, c.ple, seed=0, ac=c.aux).model.ngram_embedding
    assert not ngram.embed.weight.any() and torch.equal(ngram.lambdas, torch.full_like(ngram.lambdas, 0.1))


def test_accounting_is_the_closed_form_by_hand():
    mc = _cfg("value").model
    H, L, V, nkv, hd = mc.hidden_size, mc.num_hidden_layers, mc.vocab_size, mc.num_key_value_heads, mc.resolved_head_dim
    trunk = account(mc, _cfg("value").ple, 64)
    value = account(mc, (c := _cfg("value", "aux.layers=0,1")).ple, 64, c.aux)
    assert value.groups["aux_table"] == 2 * V * nkv * hd and value.groups["aux_other"] == 2 * 12 * nkv
    assert value.flops_per_token - trunk.flops_per_token == 6 * 2 * 12 * nkv  # the gates are the only matmuls
    rows = ngram_rows(V)
    ngram = account(mc, (c := _cfg("ngram", "aux.heads=2")).ple, 64, c.aux)
    d = H // 4  # 2 orders x 2 heads
    assert ngram.groups["aux_table"] == rows * d and ngram.groups["aux_other"] == H * 4 * d + L
    assert ngram.flops_per_token - trunk.flops_per_token == 6 * H * 4 * d
    modulation = account(mc, (c := _cfg("modulation")).ple, 64, c.aux)
    assert modulation.added == V * L * H and modulation.flops_per_token == trunk.flops_per_token
    one = account(mc, (c := _cfg("modulation", "aux.layers=1")).ple, 64, c.aux)  # one modulated layer: V·H
    assert one.added == V * H and one.groups["aux_table"] == V * H
    wide = resolve_config("cpu-tiny", ["aux.kind=ngram", "model.hidden_size=96", "aux.rows=1001", "aux.dim=7"], dp=0)
    assert account(wide.model, wide.ple, 64, wide.aux).groups["aux_table"] == 1001 * 7  # account asserts the rest


def test_params_compares_the_kinds_from_the_cli(capsys):
    assert main(["params", "--preset", "cpu-tiny", "--aux", "ple,value,ngram,modulation", "--dp", "0,8",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["dP"], r["aux_kind"]) for r in rows] == [(0, "ple"), (8, "ple"), (0, "value"), (0, "ngram"),
                                                         (0, "modulation")]
    assert rows[0]["added"] == 0 and all(r["added"] == r["total"] - rows[0]["total"] for r in rows)
    assert main(["params", "--aux", "value", "--dp", "8"]) == 2
    assert "--dp sizes PLE" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # argparse's usage error
        main(["params", "--aux", "value,value"])
    assert exit_.value.code == 2 and "distinct kinds" in capsys.readouterr().err


def test_the_tables_get_the_table_group_and_every_parameter_a_group():
    for kind in KINDS:
        cfg = _cfg(kind, "train.table_lr=0.0123", "train.table_weight_decay=0.05")
        model = build_model(cfg.model, cfg.ple, ac=cfg.aux)
        groups = {g["name"]: g for g in optimizer_groups(model, cfg.train)}
        names = {id(p): n for n, p in model.named_parameters()}
        tables = {names[id(p)] for p in groups["aux_table"]["params"]}
        assert tables and all(".embed" in n for n in tables), tables
        assert groups["aux_table"]["lr"] == pytest.approx(0.0123) and groups["aux_table"]["weight_decay"] == 0.05
        assert sum(len(g["params"]) for g in groups.values()) == len(list(model.parameters()))


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_kind_trains_and_resumes_bit_identically(kind, tmp_path, tiny_data):
    cfg = _cfg(kind, "train.steps=6", "train.checkpoint_every=3", "train.eval_every=3", "train.precision=fp32")
    whole = plelab.train(cfg, tmp_path / "whole", data=tiny_data, progress=False, log=lambda *a: None)
    assert whole.train_losses[-1] < whole.train_losses[0]
    part = plelab.train(resolve_config("cpu-tiny", [f"aux.kind={kind}", "train.steps=3", "train.checkpoint_every=3",
                                                    "train.eval_every=3", "train.precision=fp32"], dp=0),
                        tmp_path / "part", data=tiny_data, progress=False, log=lambda *a: None)
    resumed = plelab.train(cfg, tmp_path / "part", data=tiny_data, resume=True, progress=False, log=lambda *a: None)
    assert part.train_losses + resumed.train_losses == whole.train_losses
    from safetensors.torch import load_file
    a, b = (load_file(str(tmp_path / r / "checkpoints" / "step-000006" / "model.safetensors")) for r in ("whole", "part"))
    assert any(k.startswith(ROOTS[kind]) for k in a) and all(torch.equal(a[k], b[k]) for k in a)
    # an HF folder (PlelabForCausalLM), its logits checked against the run's by export itself
    assert main(["export", str(tmp_path / "whole"), str(tmp_path / "hf")]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["plelab"]["aux"]["kind"] == kind


def test_settings_a_kind_cannot_honour_are_refused():
    with pytest.raises(ConfigError, match="one table kind per run"):
        resolve_config("cpu-tiny", ["aux.kind=value"], dp=8)
    with pytest.raises(ConfigError, match="sizes the ngram table"):
        _cfg("value", "aux.orders=2")
    with pytest.raises(ConfigError, match="not a multiple of model.vocab_size"):
        _cfg("ngram", "aux.rows=1024")
    with pytest.raises(ConfigError, match="row-sparse optimizer"):
        _cfg("modulation", "train.table_optimizer=row-sparse")
    with pytest.raises(ConfigError, match="aux.layers"):
        _cfg("value", "aux.layers=5")
    with pytest.raises(PlelabError):
        resolve_config("cpu-tiny", ["aux.kind=bogus"], dp=0)


def test_aux_arms_in_a_sweep_spec_and_its_command():
    from plelab.sweeps.commands import dp_spec, parse_aux
    from plelab.sweeps.configs import run_config
    from plelab.sweeps.spec import sweep_command
    spec = dp_spec(preset="cpu-tiny", dp=[0, 8], aux=["value:layers=0,1", "ngram:rows=1031:heads=2", "modulation"],
                   steps=8)
    arms = {a.name: a for a in spec.arms}
    assert list(arms) == ["dp0", "dp8", "value-layers0.1", "ngram-rows1031-heads2", "modulation"]
    cfg = run_config(spec, arms["ngram-rows1031-heads2"], 0, "fp32")
    assert (cfg.ple.dim, cfg.aux.kind, cfg.aux.rows, cfg.aux.heads) == (0, "ngram", 1031, 2)
    assert run_config(spec, arms["value-layers0.1"], 0, "fp32").aux.layers == [0, 1]
    command = sweep_command(spec, Path("/tmp/s"))
    assert "--aux value:layers=0,1 --aux ngram:rows=1031:heads=2 --aux modulation" in command
    assert "--variant" not in command
    for bad, why in (("ngram:rows", "KIND\\[:KEY=VALUE"), ("bogus", "unknown table kind"),
                     ("value:rows=3", "not one of its settings")):
        with pytest.raises(PlelabError, match=why):
            parse_aux(bad)
    with pytest.raises(PlelabError, match="give --aux once per size"):
        dp_spec(preset="cpu-tiny", dp=[0, 8], aux=["value", "value"])


@pytest.mark.slow
def test_a_sweep_compares_the_kinds_with_the_trunk(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["sweep", "--preset", "cpu-tiny", "--dp", "0,8", "--aux", "ngram:rows=1031", "--aux", "modulation",
                 "--seeds", "3", "--steps", "8", "--out", str(out), "--no-progress"]) == 0
    results = json.loads((out / "report" / "results.json").read_text())
    rows = {r["arm"]: r for r in results["analysis"]["rows"]}
    assert rows["modulation"]["added_params"] == 512 * 2 * 64 and rows["modulation"]["n"] == 3
    vs_base = {c["b"]: c for c in results["analysis"]["controls_vs_baseline"]}
    assert set(vs_base) == {"ngram-rows1031", "modulation"} and vs_base["modulation"]["a"] == "dp0"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["modulation", "ngram"])
def test_the_verdict_reads_a_kinds_table_and_says_it_is_outside_the_benchmark(kind, tmp_path, tiny_data):
    """Row counts (token ids, or the n-gram's buckets) are saved with each checkpoint, W_0 is regenerated from the
    seed, the checkpoint diagnostics and plelab diagnose read the kind's table, and the range check names the kind."""
    from plelab.diagnostics.diagnose import diagnose_run
    from plelab.model.tables import initial_aux_table, table_view
    runs = []
    for seed in (0, 1):
        cfg = _cfg(kind, "aux.init=native", "train.steps=40", "train.checkpoint_every=40", "train.eval_every=20",
                   f"seed={seed}", "train.precision=fp32")
        plelab.train(cfg, tmp_path / f"s{seed}", data=tiny_data, progress=False, log=lambda *a: None)
        runs.append(tmp_path / f"s{seed}")
    view = table_view(cfg.model, cfg.ple, cfg.aux)
    ckpt = runs[0] / "checkpoints" / "step-000040"
    from safetensors.torch import load_file
    counts = load_file(str(ckpt / "optimizer.safetensors"))["diag.row_counts"]
    lookups = 40 * cfg.train.batch_size * cfg.train.seq_len * (len(cfg.aux.orders) * cfg.aux.heads
                                                               if kind == "ngram" else 1)
    assert counts.shape == (view.rows,) and int(counts.sum()) == lookups
    live = json.loads((ckpt / "diagnostics.json").read_text())
    assert len(live["layers"]) == view.layers and "permute" in live["use"]
    rep = diagnose_run(runs[0], reference=runs[1], progress=False, windows=16)
    assert rep["key"] == view.key and rep["shape"] == [view.rows, view.layers, view.dim]
    assert rep["table"]["cross_seed"]["cka"] is not None and rep["table"]["use"]["permute"]["windows"] == 16
    assert "table kind" in rep["reliability"][0] and kind in rep["reliability"][0]
    w0 = initial_aux_table(cfg.model, cfg.aux, 0)
    assert not torch.equal(w0, load_file(str(ckpt / "model.safetensors"))[view.key])  # trained away from W_0


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["modulation", "ngram"])
def test_a_real_and_an_iid_keyed_table_get_the_right_use_verdicts(kind, tmp_path, tiny_data):
    """The null control for any kind (aux.ids=iid: lookups drawn from the real rows' frequencies — bucket
    frequencies, [B,T,S] draws, for the n-gram table): the real table is USED, the i.i.d.-keyed one UNUSED."""
    from plelab.diagnostics.diagnose import diagnose_run
    calls = {}
    for ids in ("token", "iid"):
        cfg = _cfg(kind, "aux.init=native", f"aux.ids={ids}", "train.steps=60", "train.checkpoint_every=60",
                   "train.eval_every=30", "train.precision=fp32")
        plelab.train(cfg, tmp_path / ids, data=tiny_data, progress=False, log=lambda *a: None)
        calls[ids] = diagnose_run(tmp_path / ids, progress=False)["table"]["verdict"]  # the calibrated windows
    assert calls["token"]["use"] == "USED" and calls["iid"]["use"] == "UNUSED", calls
    assert calls["iid"]["benefit"] == "NO BENEFIT"
    assert main(["export", str(tmp_path / "iid"), str(tmp_path / "hf")]) == 2 and not (tmp_path / "hf").exists()
    with pytest.raises(ConfigError, match="PLE's null control is ple.ids=iid"):
        resolve_config("cpu-tiny", ["aux.ids=iid"], dp=8)


def test_an_ngram_arm_matched_to_a_ple_arms_parameters():
    from plelab.sweeps.commands import dp_spec
    from plelab.sweeps.configs import run_config
    spec = dp_spec(preset="cpu-tiny", dp=[0, 16], aux=["ngram:match=16", "ngram:match=16:heads=2"], steps=8)
    added = {}
    for arm in spec.arms:
        cfg = run_config(spec, arm, 0, "fp32")
        added[arm.name] = account(cfg.model, cfg.ple, cfg.train.seq_len, cfg.aux).added
    matched = [name for name in added if name.startswith("ngram-rows")]
    assert len(matched) == 2 and all(0 <= added[n] - added["dp16"] <= 0.02 * added["dp16"] for n in matched), added
    for bad, why in (("value:match=16", "only the n-gram table"), ("ngram:match=0", "dP >= 1"),
                     ("ngram:match=16:rows=1031", "give one of them")):
        with pytest.raises(ConfigError, match=why):
            dp_spec(preset="cpu-tiny", dp=[0, 16], aux=[bad], steps=8)


def test_an_ngram_run_hashes_each_micro_batch_once(tmp_path, tiny_data, monkeypatch):
    """The trainer hashes a micro-batch's n-grams once (for the row counts) and hands the buckets to the model as
    its table_ids; the model does not hash them again."""
    import plelab.model.ngram as ngram_module
    import plelab.model.tables as tables_module

    calls = []
    real = ngram_module.ngram_ids

    def counted(input_ids, **kwargs):
        calls.append((tuple(input_ids.shape), torch.is_grad_enabled()))
        return real(input_ids, **kwargs)

    monkeypatch.setattr(ngram_module, "ngram_ids", counted)
    monkeypatch.setattr(tables_module, "ngram_ids", counted)
    cfg = _cfg("ngram", "train.steps=3", "train.eval_every=100", "train.checkpoint_every=100", "train.diag_every=0")
    plelab.train(cfg, tmp_path / "run", data=tiny_data, progress=False, log=lambda *a: None)
    micro = cfg.train.steps * cfg.train.grad_accum
    training = [shape for shape, grad in calls if grad]
    assert len(training) == micro and all(s == (cfg.train.batch_size // cfg.train.grad_accum, cfg.train.seq_len)
                                          for s in training), calls


def test_modulation_on_a_subset_equals_every_layer_with_the_others_zero():
    """aux.layers=1 modulates layer 1 alone: the same logits as modulating every layer with layer 0's block zero."""
    sub = build_model((c := _cfg("modulation", "aux.layers=1")).model, c.ple, seed=3, ac=c.aux)
    full = build_model((f := _cfg("modulation")).model, f.ple, seed=3, ac=f.aux)
    H = c.model.hidden_size
    with torch.no_grad():
        sub.model.token_modulation.embed.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(1))
        full.model.token_modulation.embed.weight.zero_()
        full.model.token_modulation.embed.weight[:, H:2 * H] = sub.model.token_modulation.embed.weight
        ids = torch.randint(0, c.model.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
        torch.testing.assert_close(sub(ids).logits, full(ids).logits, rtol=0, atol=0)
    assert tuple(sub.model.token_modulation.embed.weight.shape) == (c.model.vocab_size, H)
