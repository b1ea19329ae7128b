"""dP studies on the user's architecture (issue 53 item 5): an HF trunk from its config.json and your own model from a
factory, through the same trainer, sweep, report, advise and diagnose — and what such a trunk cannot honour, refused."""

from __future__ import annotations

import json
import math
import sys
import textwrap

import pytest
import torch
import transformers

import plelab
from plelab.cli import main
from plelab.config import resolve_config
from plelab.errors import ConfigError, PlelabError
from plelab.integrations.hosts import build_factory, build_hf, host_accounting
from plelab.model.init import initial_normal, table_init_std
from plelab.model.ple import TABLE_KEY, PLEModules

SHORT = ["train.steps=16", "train.eval_every=8", "train.checkpoint_every=8", "train.diag_every=4",
         "train.diag_windows=8", "train.eval_batches=2", "train.warmup_steps=2"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny Llama's config.json, written by transformers (nothing downloaded)."""
    folder = tmp_path_factory.mktemp("llama")
    transformers.LlamaConfig(vocab_size=512, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128,
                             rope_theta=5000.0).save_pretrained(folder)
    return folder


FACTORY = textwrap.dedent('''
    import torch
    import torch.nn.functional as F
    from torch import nn
    import plelab

    class Block(nn.Module):
        def __init__(self, H, dP, gate, gate_init):
            super().__init__()
            self.ln, self.mlp = nn.LayerNorm(H), nn.Sequential(nn.Linear(H, 2 * H), nn.GELU(), nn.Linear(2 * H, H))
            self.ple = plelab.PerLayerInjection(H, dP, gate, gate_init=gate_init) if dP else None

        def forward(self, x, p):
            x = x + self.mlp(self.ln(x))
            return x if self.ple is None else x + self.ple(x, p)

    class Tiny(nn.Module):
        """A causal MLP "decoder" (no attention: enough for the protocol), forward -> (logits, None)."""

        def __init__(self, cfg, dim=None):
            super().__init__()
            m, pc = cfg.model, cfg.ple
            dP = pc.dim if dim is None else dim
            self.wte = nn.Embedding(m.vocab_size, m.hidden_size)
            self.rows = pc.resolved_vocab_size(m)
            self.per_layer = (plelab.PerLayerEmbedding(self.rows, m.hidden_size, m.num_hidden_layers, dP,
                                                       embed_scale=pc.embed_scale) if dP else None)
            self.blocks = nn.ModuleList(Block(m.hidden_size, dP, pc.gate, pc.gate_init)
                                        for _ in range(m.num_hidden_layers))
            self.head = nn.Linear(m.hidden_size, m.vocab_size, bias=False)

        def forward(self, idx):
            x = self.wte(idx)
            P = self.per_layer(x, idx.clamp_max(self.rows - 1)) if self.per_layer is not None else None
            for i, block in enumerate(self.blocks):
                x = block(x, None if P is None else P[:, :, i])
            return self.head(x), None

    def build(cfg):
        return Tiny(cfg)

    def wrong_dim(cfg):
        return Tiny(cfg, dim=cfg.ple.dim + 1)

    def not_a_model(cfg):
        return 3
''')


@pytest.fixture
def factory_module(tmp_path, monkeypatch):
    (tmp_path / "tiny_factory.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "tiny_factory"
    sys.modules.pop("tiny_factory", None)


def test_hf_config_sets_the_trunk_fields_and_refuses_a_contradiction(llama, tmp_path):
    cfg = resolve_config("cpu-tiny", [f"model.hf_config={llama}"], dp=8)
    m = cfg.model
    assert (m.host, m.vocab_size, m.hidden_size, m.num_hidden_layers, m.num_key_value_heads, m.intermediate_size,
            m.rope_theta, m.tie_word_embeddings) == ("hf", 512, 32, 2, 2, 64, 5000.0, False)
    assert m.hf_config == str(llama)  # absolute: the config works from anywhere
    with pytest.raises(ConfigError, match="model.hidden_size=128 but the HF trunk's .* says 32"):
        resolve_config("cpu-tiny", [f"model.hf_config={llama}", "model.hidden_size=128"])
    assert resolve_config("cpu-tiny", [f"model.hf_config={llama}", "model.hidden_size=32"]).model.hidden_size == 32
    for bad, why in ((tmp_path / "none.json", "cannot read"), (tmp_path / "bad.json", "not JSON"),
                     (tmp_path / "nokind.json", "names no model_type")):
        (tmp_path / "bad.json").write_text("{")
        (tmp_path / "nokind.json").write_text("{}")
        with pytest.raises(ConfigError, match=why):
            resolve_config("cpu-tiny", [f"model.hf_config={bad}"])
    with pytest.raises(ConfigError, match="one trunk"):
        resolve_config("cpu-tiny", [f"model.hf_config={llama}", "model.factory=a:b"])


def test_hf_trunk_is_attach_with_the_runs_w0(llama):
    cfg = resolve_config("cpu-tiny", [f"model.hf_config={llama}", "ple.gate=scalar", "ple.gate_init=0.5"], dp=8, seed=3)
    model = build_hf(cfg)
    assert type(model).__name__ == "LlamaForCausalLM"
    ple = PLEModules(model)
    assert ple.dim == 8 and ple.num_layers == 2 and ple.embedding.embed_scale == pytest.approx(8 ** 0.5)
    w0 = initial_normal(TABLE_KEY, (512, 16), 3, table_init_std(cfg.model, cfg.ple))
    assert torch.equal(model.state_dict()[TABLE_KEY], w0)  # what the diagnostics regenerate from the seed
    assert all(float(inj.owner.per_layer_gate.detach()) == 0.5 for inj in ple.injections)
    again = build_hf(cfg)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    base = build_hf(resolve_config("cpu-tiny", [f"model.hf_config={llama}"], dp=0, seed=3))
    with pytest.raises(LookupError):
        PLEModules(base)
    # the trunk's init does not depend on dP: every arm of a seed starts from the same trunk
    shared = {k: v for k, v in base.state_dict().items()}
    assert all(torch.equal(model.state_dict()[k], v) for k, v in shared.items())
    acc = host_accounting(cfg)
    assert acc["base"] == sum(p.numel() for p in base.parameters())
    assert acc["ple_table"] == 512 * 16 and acc["added"] == sum(p.numel() for p in ple.parameters())
    zero = build_hf(resolve_config("cpu-tiny", [f"model.hf_config={llama}", "ple.table=zero"], dp=8))
    assert not PLEModules(zero).table.any() and not PLEModules(zero).table.requires_grad


@pytest.mark.slow
def test_sweep_on_an_hf_trunk_gives_a_report_and_advise_json(llama, tmp_path, capsys):
    out = tmp_path / "sw"
    args = ["sweep", "--preset", "cpu-tiny", "--hf-config", str(llama), "--dp", "0,8", "--seeds", "2", "--steps", "16",
            "--out", str(out), "--no-progress", *[x for s in SHORT[1:] for x in ("--set", s)]]
    assert main(args) == 0
    report = (out / "report" / "report.md").read_text()
    assert f"the HF trunk {llama}" in report
    assert "outside the calibrated range (" in report  # the benchmark trains plelab's decoder only
    assert "trunk: the HF trunk" in report and "plelab's decoder, the only trunk the benchmark trains" in report
    results = json.loads((out / "report" / "results.json").read_text())
    base = sum(p.numel() for p in build_hf(resolve_config("cpu-tiny", [f"model.hf_config={llama}"], dp=0)).parameters())
    assert results["regime"]["base_params"] == base
    capsys.readouterr()
    assert main(["advise", str(out), "--json"]) == 0
    advice = json.loads(capsys.readouterr().out)
    assert advice["measured"] == [0, 8] and advice["seeds"] == 2
    # a pilot with fewer evaluations than its last_k: plan quotes the report's number at the outcome it used
    from plelab.reports.sweep_findings import required_seeds
    from plelab.stats.analysis import analyse
    from plelab.stats.planning import plan
    from plelab.sweeps.results import collect

    p = plan(out)
    assert p["pilot_last_k"] == 2 and p["seeds_at_pilot_outcome"]
    assert {k: p["seeds_at_pilot_outcome"][k] for k in ("consecutive", "vs_baseline")} == required_seeds(
        analyse(collect(out, structure=False)), 0.05)
    diag = json.loads(next((out / "runs").glob("dp8/seed-0/checkpoints/step-000016/diagnostics.json")).read_text())
    assert math.isfinite(diag["use"]["permute"]["delta"])  # computed through the HF trunk's logits
    assert plelab.diagnose(next((out / "runs").glob("dp8/seed-0")), progress=False)["table"]["verdict"]


@pytest.mark.slow
def test_iid_control_on_an_hf_trunk_trains(llama, tmp_path):
    cfg = resolve_config("cpu-tiny", [f"model.hf_config={llama}", "ple.ids=iid", *SHORT], dp=8)
    result = plelab.train(cfg, tmp_path / "iid", progress=False, log=lambda *a: None)
    assert result.final_val_loss < 6.3  # ln 512 = 6.24 at the start: it trained


@pytest.mark.slow
def test_factory_trunk_trains_and_is_checked(factory_module, tmp_path):
    cfg = resolve_config("cpu-tiny", [f"model.factory={factory_module}:build", *SHORT], dp=8)
    result = plelab.train(cfg, tmp_path / "f8", progress=False, log=lambda *a: None)
    assert result.final_val_loss < 6.3
    diag = json.loads((tmp_path / "f8" / "checkpoints" / "step-000016" / "diagnostics.json").read_text())
    assert "use" in diag and diag["rows_used"] > 0
    model = build_factory(cfg)
    assert torch.equal(PLEModules(model).table, initial_normal(TABLE_KEY, (512, 16), 0, 0.02))
    base = resolve_config("cpu-tiny", [f"model.factory={factory_module}:build", *SHORT], dp=0)
    assert plelab.train(base, tmp_path / "f0", progress=False, log=lambda *a: None).final_val_loss < 6.3
    with pytest.raises(PlelabError, match="ple.dim = 9 but the config says 8"):
        build_factory(resolve_config("cpu-tiny", [f"model.factory={factory_module}:wrong_dim"], dp=8))
    with pytest.raises(PlelabError, match="holds PLE modules but ple.dim=0"):
        build_factory(resolve_config("cpu-tiny", [f"model.factory={factory_module}:wrong_dim"], dp=0))
    with pytest.raises(PlelabError, match="returned int, not a torch nn.Module"):
        build_factory(resolve_config("cpu-tiny", [f"model.factory={factory_module}:not_a_model"]))
    with pytest.raises(ConfigError, match="has no function 'nope'"):
        build_factory(resolve_config("cpu-tiny", [f"model.factory={factory_module}:nope"]))
    with pytest.raises(ConfigError, match="cannot import no_such_module_x"):
        build_factory(resolve_config("cpu-tiny", ["model.factory=no_such_module_x:build"]))


@pytest.mark.parametrize("setting, needle", [
    ("ple.vocab_remap=frequency", "ple.vocab_remap='frequency' cannot be honoured"),
    ("train.table_optimizer=row-sparse", "train.table_optimizer='row-sparse' cannot be honoured"),
    ("train.activation_checkpointing=true", "train.activation_checkpointing=True cannot be honoured"),
    ("train.compile=true", "train.compile=True cannot be honoured"),
])
def test_a_host_trunk_refuses_what_it_cannot_honour(llama, tmp_path, setting, needle, capsys):
    extra = ["--set", "ple.vocab_size=256"] if "frequency" in setting else []
    code = main(["train", "--preset", "cpu-tiny", "--hf-config", str(llama), "--dp", "8", "--set", setting, *extra,
                 "--out", str(tmp_path / "r"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "Traceback" not in err


def test_factory_refuses_the_iid_control(factory_module, tmp_path):
    cfg = resolve_config("cpu-tiny", [f"model.factory={factory_module}:build", "ple.ids=iid"], dp=8)
    with pytest.raises(ConfigError, match="ple.ids=iid needs the model's forward to take table_ids"):
        plelab.train(cfg, tmp_path / "r", progress=False, log=lambda *a: None)


@pytest.mark.slow
def test_eval_and_export_name_what_reads_a_host_run(llama, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--preset", "cpu-tiny", "--hf-config", str(llama), "--dp", "8", "--out", str(run),
                 "--no-progress", *[x for s in SHORT for x in ("--set", s)]]) == 0
    capsys.readouterr()
    assert main(["eval", str(run)]) == 2
    assert "trained on a model.hf_config trunk" in capsys.readouterr().err
    model, cfg = plelab.load_host_run(run)
    assert cfg.model.hf_config == str(llama) and PLEModules(model).dim == 8
