"""The visual next-token fix (L = L_text + λ·L_visual) and the redundancy ablation switches."""

from __future__ import annotations

import json
import math

import pytest
import torch

from plelab.cli import main
from plelab.config import resolve_config
from plelab.config.schema import ModelConfig, PLEConfig
from plelab.errors import PlelabError
from plelab.runs import make_trainer as VisualTrainer
from plelab.visual.data import prepare_visual
from plelab.visual.model import build_visual_model

H, L, DP, K, P, D = 64, 2, 8, 16, 9, 12


def _model(**kw):
    mc = ModelConfig(vocab_size=40, hidden_size=H, num_hidden_layers=L, intermediate_size=96, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16)
    return build_visual_model(mc, PLEConfig(dim=DP), feature_dim=D, num_patches=P, num_ids=K, seed=0, **kw).eval()


@pytest.fixture
def batch():
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(2, P, D, generator=gen), torch.randint(0, K, (2, P), generator=gen),
            torch.randint(3, 40, (2, 6), generator=gen))


def test_image_positions_are_causal_when_the_visual_loss_is_on(batch):
    """Position p predicts id_{p+1}: nothing from patch p+1 on may reach positions ≤ p (no target leak)."""
    model = _model(visual_head=True)
    feats, ids, caps = batch
    seq, h, z = model.sequence(feats, ids, caps)
    base = model.lm.model(seq, inputs_embeds=h, token_part=z)
    feats2, ids2 = feats.clone(), ids.clone()
    feats2[:, 5:] += 3.0
    ids2[:, 5:] = (ids2[:, 5:] + 1) % K  # change patches 5.. (features and visual-table rows)
    seq2, h2, z2 = model.sequence(feats2, ids2, caps)
    after = model.lm.model(seq2, inputs_embeds=h2, token_part=z2)
    assert torch.allclose(base[:, :5], after[:, :5], atol=1e-6)  # positions 0..4 unchanged
    assert not torch.allclose(base[:, 5], after[:, 5])


def test_visual_loss_targets_the_next_patch_id():
    model = _model(visual_head=True)
    ids = torch.tensor([[3, 7, 7, 1, 0, 15, 2, 2, 9]])
    with torch.no_grad():
        model.visual_lm_head.weight.copy_(torch.eye(K, H) * 30)
    hidden = torch.zeros(1, P, H)
    hidden[0, torch.arange(P - 1), ids[0, 1:]] = 1.0  # position p "says" id_{p+1}
    ce = model.visual_ce(hidden, ids)
    assert ce.shape == (1, P - 1) and ce.max() < 1e-6
    shifted = torch.zeros(1, P, H)
    shifted[0, torch.arange(P - 1), ids[0, :-1]] = 1.0  # says id_p: wrong wherever id_p != id_{p+1}
    assert model.visual_ce(shifted, ids)[0, 0] > 10
    with torch.no_grad():
        model.visual_lm_head.weight.zero_()
    assert torch.allclose(model.visual_ce(hidden, ids), torch.full((1, P - 1), math.log(K)))


def test_forward_feeds_the_image_positions_to_the_visual_head(batch):
    model = _model(visual_head=True)
    feats, ids, caps = batch
    text, visual = model(feats, ids, caps, return_visual=True)
    seq, h, z = model.sequence(feats, ids, caps)
    hidden = model.lm.model(seq, inputs_embeds=h, token_part=z)
    assert torch.allclose(visual, model.visual_ce(hidden[:, :P], ids)) and visual.shape == (2, P - 1)
    assert torch.equal(text, model(feats, ids, caps))  # the caption loss does not depend on the head


def test_ablation_switches(batch):
    feats, ids, caps = batch
    layer0 = _model(injection="layer0", use_features=False)
    names = {n for n, _ in layer0.named_parameters()}
    assert "visual_embed_tokens.weight" in names and "visual_embed_tokens_per_layer.weight" not in names
    assert "image_embed" in names and not any(n.startswith("projector") for n in names)
    _, h, z = layer0.sequence(feats, ids, caps)
    expected = layer0.image_embed + layer0.visual_embed_tokens(ids) * layer0.lm.model.embed_scale
    assert torch.allclose(h[:, :P], expected) and torch.count_nonzero(z[:, :P]) == 0  # no per-layer rows
    no_table = _model(injection="none", visual_head=True)
    names = {n for n, _ in no_table.named_parameters()}
    assert "visual_lm_head.weight" in names and not any(n.startswith("visual_embed") for n in names)
    per_layer = _model()
    assert per_layer.num_ids == K and not per_layer.layer0 and per_layer.visual_lm_head is None


VIS = ["visual.enabled=true", "visual.scenes=300", "visual.val_scenes=40", "visual.encoder_steps=30",
       "train.batch_size=16", "train.eval_every=10", "train.diag_every=5", "train.warmup_steps=5"]


@pytest.mark.slow
def test_training_with_the_visual_loss_and_its_config_checks():
    cfg = resolve_config("cpu-tiny", [*VIS, "visual.ids=oracle", "visual.loss_weight=1"], dp=8, steps=30)
    trainer = VisualTrainer(cfg, prepare_visual(cfg), progress=False, log=lambda *x: None)
    assert [g["name"] for g in trainer.opt.param_groups][-2:] == ["visual_table", "visual_head"]
    trainer.fit()
    out = trainer.task.summary(trainer.model, trainer.step, trainer.row_counts())["visual"]
    assert out["visual_loss"] < math.log(64) - 1  # the next patch's label is learnable (neighbours agree)
    for extra, needle in ((["visual.loss_weight=0.5"], "visual.loss_weight"),  # ids=none: nothing to predict
                          (["visual.ids=oracle", "visual.loss_weight=inf"], "finite"),
                          (["visual.ids=oracle", "visual.table=false"], "visual.table"),  # = ids=none
                          (["visual.ids=oracle", "visual.table=false", "visual.injection=layer0",
                            "visual.loss_weight=1"], "visual.injection"),
                          (["visual.injection=layer0"], "a tokenizer")):
        with pytest.raises(PlelabError, match=needle):
            resolve_config("cpu-tiny", [*VIS, *extra], dp=8)
    with pytest.raises(PlelabError, match="ple.dim > 0"):  # the per-layer table needs PLE
        resolve_config("cpu-tiny", [*VIS, "visual.ids=oracle"], dp=0)
    for extra in (["visual.injection=layer0"], ["visual.table=false", "visual.loss_weight=0.5"]):
        cfg = resolve_config("cpu-tiny", [*VIS, "visual.ids=oracle", *extra], dp=0, steps=3)  # no PLE needed
        VisualTrainer(cfg, prepare_visual(cfg), progress=False, log=lambda *x: None).fit()  # param groups cover


@pytest.mark.slow
def test_fix_design_runs_and_reports_the_2x2(tmp_path, capsys):
    out = tmp_path / "fix"
    assert main(["visual-study", "--quick", "--design", "fix", "--methods", "none,oracle", "--lambdas", "1",
                 "--out", str(out), "--no-progress"]) == 0
    md = (out / "report" / "report.md").read_text()
    assert "The visual next-token fix" in md and "\n| oracle | 1 | " in md
    data = json.loads((out / "report" / "results.json").read_text())
    fams = data["analysis"]["references"]["content"]
    assert set(fams) == {"fix: table on, λ=1", "fix: table off, λ=1"}
    assert fams["fix: table on, λ=1"][0]["a"] == "oracle" and fams["fix: table off, λ=1"][0]["a"] == "none"
    rows = {r["method"]: r for r in data["analysis"]["rows"]}
    assert math.isfinite(rows["oracle.lv1"]["visual_loss"][0]) and rows["oracle"]["visual_loss"][0] is None
    (inter,) = data["analysis"]["interactions"]["content"]["1"]  # 2 seeds: the interaction of the one tokenizer
    assert (inter["a"], inter["b"], inter["n"]) == ("oracle.notable.lv1 − none", "oracle.lv1 − oracle", 2)
    assert "The fix as an interaction" in md and "\n| oracle | 1 | " in md.split("The fix as an interaction")[1]
    arms = [a["name"] for a in json.loads((out / "sweep.json").read_text())["arms"]]  # the gate's null, a plain arm
    assert arms == ["none", "oracle", "random", "oracle.lv1", "oracle.notable.lv1"]
    assert data["analysis"]["gate"]["comparison"]["n"] == 2
    for bad in ("0", "0.5,x"):
        assert main(["visual-study", "--quick", "--design", "fix", "--lambdas", bad, "--out", str(tmp_path / "y")]) == 2
        assert "--lambdas" in capsys.readouterr().err


def test_fix_design_families_hold_one_arm_per_tokenizer():
    from plelab.visual.study import FIX_METHODS, design_arms

    arms, shared = design_arms("fix", FIX_METHODS, [0.1, 0.5, 1.0, 1])
    fams: dict[str, list] = {}
    for a in arms:
        fams.setdefault(a.family, []).append(a)
    tokenizers = [m for m in FIX_METHODS if m != "none"]
    assert len(tokenizers) == 5 and shared == []
    assert sorted(f for f in fams if f.startswith("fix")) == sorted(
        f"fix: table {s}, λ={lam}" for s in ("on", "off") for lam in ("0.1", "0.5", "1"))  # 1 and 1.0: one λ
    for fam, members in fams.items():
        if fam.startswith("fix"):  # Holm across the five tokenizers at each λ
            assert len(members) == 5 and {a.reference for a in members} <= {"none", *tokenizers}
    assert len({a.name for a in arms}) == len(arms) == 1 + 5 + 5 * 3 * 2


@pytest.mark.slow
def test_ablation_design_withholds_features(tmp_path):
    out = tmp_path / "abl"
    assert main(["visual-study", "--quick", "--design", "ablation", "--methods", "none,oracle", "--seeds", "1",
                 "--no-gate", "--out", str(out), "--no-progress"]) == 0
    spec = json.loads((out / "sweep.json").read_text())
    assert "visual.features=false" in spec["overrides"]
    assert [a["name"] for a in spec["arms"]] == ["none", "oracle", "oracle.layer0"]
    assert "Redundancy ablation" in (out / "report" / "report.md").read_text()


def test_the_fix_interaction_is_found_where_it_is_and_not_where_it_is_not():
    """Synthetic 2×2s, paired by seed: tokenizer A's L_visual helps only with the table on (a true interaction of
    −0.15), B's helps equally with and without it (none); a shared seed effect, which pairing removes."""
    import numpy as np

    from plelab import stats
    from plelab.visual.study import interaction_family

    rng = np.random.default_rng(0)
    seed_effect = {s: rng.normal(0, 0.3) for s in range(8)}

    def arm(mu):
        return {s: mu + seed_effect[s] + rng.normal(0, 0.005) for s in seed_effect}
    values = {"none": arm(2.0), "A": arm(1.9), "A.lv1": arm(1.7), "A.notable.lv1": arm(1.95),
              "B": arm(1.9), "B.lv1": arm(1.85), "B.notable.lv1": arm(1.95)}
    cells = [("A.lv1", "A", "A.notable.lv1", "none"), ("B.lv1", "B", "B.notable.lv1", "none")]
    a, b = interaction_family(values, cells, delta=0.02, alpha=0.05)
    assert (a.a, a.b) == ("A.notable.lv1 − none", "A.lv1 − A") and a.n == 8
    # the planted −0.15, within 4 standard errors of the design (4 arms × noise 0.005: sd 0.01 per seed, se 0.0035)
    assert abs(a.mean + 0.15) < 4 * 0.01 / math.sqrt(a.n) and a.label == stats.DROP
    assert b.ci_low < 0 < b.ci_high and b.label == stats.EQUIVALENT and b.m_family == 2
    values.pop("B.notable.lv1")  # a cell with an arm missing is left out, the rest still tested
    assert [c.b for c in interaction_family(values, cells, 0.02, 0.05)] == ["A.lv1 − A"]
