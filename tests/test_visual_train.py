"""Visual runs: training through the text trainer's loop, resume, caption report, and the controls."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

from plelab.cli import main
from plelab.config import resolve_config
from plelab.errors import PlelabError
from plelab.runs import make_trainer as VisualTrainer
from plelab.visual.data import caption_losses, prepare_visual
from plelab.visual.sampler import SceneSampler

VIS = ["visual.enabled=true", "visual.scenes=300", "visual.val_scenes=40", "visual.encoder_steps=30",
       "train.batch_size=16", "train.eval_every=10", "train.diag_every=5", "train.warmup_steps=5"]


def _cfg(ids: str, steps: int = 20, seed: int = 0, extra=()):
    return resolve_config("cpu-tiny", [*VIS, f"visual.ids={ids}", *extra], dp=8, steps=steps, seed=seed)


@pytest.mark.slow
def test_visual_run_trains_resumes_and_reports(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "--preset", "cpu-tiny", "--dp", "8", "--steps", "20", "--out", str(out), "--no-progress",
            *sum((["--set", s] for s in [*VIS, "visual.ids=dct-kmeans", "train.checkpoint_every=10"]), [])]
    assert main(args) == 0
    assert "image–caption pairs" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    vis = summary["visual"]
    assert vis["ids"] == "dct-kmeans" and 0 < vis["id_metrics"]["nmi"] <= 1
    assert vis["no_image_caption"] > vis["caption"] > 0 and vis["content"] > vis["template"]
    assert json.loads((out / "config.json").read_text())["model"]["vocab_size"] < 64  # the caption vocabulary
    assert main(["train", "--out", str(out), "--resume", "--steps", "30", "--no-progress"]) == 0
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 31))
    diag = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "diag" in line]
    assert diag and diag[0]["diag"]["snr"][0] > 0  # the live signal probes work on the visual model's LM
    d = diag[-1]["diag"]  # the gradient per used row reaching each table, per layer
    assert len(d["grad_row_visual"]) == len(d["grad_row_text"]) == 2 and min(d["grad_row_visual"]) > 0
    assert vis["id_stability"]["flip_rate"] == 0 and vis["id_stability"]["chance"] > 0.5  # a frozen tokenizer
    tables = json.loads((out / "summary.json").read_text())["visual"]["tables"]
    assert set(tables) == {"text", "visual"} and tables["visual"]["rows"] == 64
    for t in tables.values():
        assert len(t["layers"]) == 2 and t["null"]["n"] == t["rows_used"] > 0
        assert t["use_verdict"] in ("USED", "UNUSED", "UNDECIDED")
        assert {"caption", "content"} <= set(t["use"]["permute"]) and t["use"]["reset"]["caption"]["captions"] == 40


@pytest.fixture(scope="module")
def prepared():
    return {ids: prepare_visual(_cfg(ids)) for ids in ("none", "oracle", "random", "dct-kmeans")}


def _trainer(ids, prepared, **kw):
    return VisualTrainer(_cfg(ids, **kw), prepared[ids], progress=False, log=lambda *x: None)


def test_visual_runs_are_deterministic_and_paired(prepared):
    a, b = _trainer("oracle", prepared), _trainer("oracle", prepared)
    base = _trainer("none", prepared)
    for name, p in base.model.lm.named_parameters():  # same seed, any arm: the same LM at step 0
        assert torch.equal(p, dict(a.model.lm.named_parameters())[name])
    assert torch.equal(base.model.projector.weight, a.model.projector.weight)
    assert a.fit().train_losses == b.fit().train_losses
    assert not hasattr(base.model, "visual_embed_tokens_per_layer")
    assert [g["name"] for g in a.opt.param_groups][-2:] == ["projector", "visual_table"]
    s = SceneSampler(10, seed=1)
    first = torch.cat([s.batch(k, 5) for k in range(2)])
    assert sorted(first.tolist()) == list(range(10)) and torch.equal(s.batch(0, 5), SceneSampler(10, 1).batch(0, 5))


def test_random_ids_are_fresh_draws_from_the_real_frequencies(prepared):
    data = prepared["random"]
    idx = torch.arange(8)
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    a, b = data.batch_ids(idx, g1), data.batch_ids(idx, g2)
    assert a.shape == (8, 36) and not torch.equal(a, b)
    dct = prepared["dct-kmeans"]
    real = torch.bincount(dct.train_ids.flatten(), minlength=64).double()
    assert torch.allclose(data.random_probs.double(), real / real.sum(), atol=1e-6)
    assert data.id_metrics["nmi"] < 0.2 < dct.id_metrics["nmi"]


def test_caption_losses_split():
    caps = torch.tensor([[5, 6, 1, 0]])
    content = torch.tensor([[True, False, False, False]])
    per = torch.tensor([[2.0, 1.0, 0.5, 0.0]])
    rep = caption_losses(per, caps, content)
    assert rep == {"caption": pytest.approx(3.5 / 3), "content": 2.0, "template": pytest.approx(0.75)}


def test_features_can_be_withheld(prepared):
    tr = _trainer("oracle", prepared, extra=["visual.features=false"])
    assert not hasattr(tr.model, "projector") and tr.model.image_embed.shape == (64,)
    assert [g["name"] for g in tr.opt.param_groups][-2:] == ["image_embed", "visual_table"]
    d = prepared["oracle"]
    feats = d.val_feats[:4]
    loss = tr.model(feats, d.val_ids[:4], d.val_caps[:4])
    assert torch.equal(loss, tr.model(feats * 5, d.val_ids[:4], d.val_caps[:4]))  # features do not enter
    assert not torch.equal(loss, tr.model(feats, (d.val_ids[:4] + 1) % 64, d.val_caps[:4]))  # the IDs do


def test_feature_noise_degrades_only_the_lms_view(prepared):
    """visual.feature_noise: fixed noise (sd = σ × each feature's sd) on what the LM reads; the tokenizers' IDs and
    the clean features stay; the same draw every time; the data key changes (no cache or pairing mix-up)."""
    clean = prepared["dct-kmeans"]
    noisy = prepare_visual(_cfg("dct-kmeans", extra=["visual.feature_noise=2"]))
    assert torch.equal(noisy.train_feats, clean.train_feats) and torch.equal(noisy.train_ids, clean.train_ids)
    assert clean.lm_train_feats is clean.train_feats and clean.lm_val_feats is clean.val_feats
    noise = (noisy.lm_train_feats - noisy.train_feats).flatten(0, 1)
    ratio = noise.std(dim=0) / clean.train_feats.flatten(0, 1).std(dim=0)
    assert torch.allclose(ratio, torch.full_like(ratio, 2.0), rtol=0.1)
    assert not torch.allclose(noisy.lm_val_feats, noisy.val_feats)
    again = prepare_visual(_cfg("dct-kmeans", extra=["visual.feature_noise=2"]))
    assert torch.equal(again.lm_train_feats, noisy.lm_train_feats)
    assert noisy.corpus_fingerprint != clean.corpus_fingerprint
    with pytest.raises(PlelabError, match="feature_noise"):
        _cfg("oracle", extra=["visual.features=false", "visual.feature_noise=1"])


@pytest.mark.slow
def test_resumed_visual_run_matches_an_uninterrupted_one(prepared, tmp_path):
    cfg = _cfg("random", extra=["train.checkpoint_every=5"])
    whole = VisualTrainer(cfg, prepared["random"], tmp_path / "a", progress=False, log=lambda *x: None).fit()
    part = VisualTrainer(_cfg("random", extra=["train.checkpoint_every=5"]), prepared["random"], tmp_path / "b",
                         progress=False, log=lambda *x: None)
    part._start = time.perf_counter()
    assert [part.train_step()["loss"] for _ in range(7)] == whole.train_losses[:7]
    part.save_checkpoint()  # as if killed right after step 7's checkpoint
    del part
    rest = VisualTrainer(_cfg("random", extra=["train.checkpoint_every=5"]), prepared["random"], tmp_path / "b",
                         resume=True, progress=False, log=lambda *x: None).fit()
    assert rest.train_losses == whole.train_losses[7:] and rest.val_history[-1] == whole.val_history[-1]
    summaries = [json.loads((tmp_path / r / "summary.json").read_text())["visual"] for r in "ab"]
    assert summaries[0]["tables"] == summaries[1]["tables"]  # row counts restored: the same diagnostics
    assert summaries[0]["id_stability"]["flip_rate"] > 0.5  # random IDs: fresh draws flip at about chance
    assert abs(summaries[0]["id_stability"]["flip_rate"] - summaries[0]["id_stability"]["chance"]) < 0.03
    other = _cfg("random", extra=["train.checkpoint_every=5", "visual.caption_len=8"])
    with pytest.raises(PlelabError, match="different visual"):
        VisualTrainer(other, prepared["random"], tmp_path / "b", resume=True, progress=False, log=lambda *x: None)


def test_visual_config_cross_checks():
    for extra, needle in ((["visual.ids=dct-kmeans"], "ple.dim > 0"), (["ple.ids=iid"], "visual.ids=random"),
                          (["visual.ids=oracle", "visual.k=16"], "k >= 37"),
                          (["visual.image_size=8"], "at least twice")):
        with pytest.raises(PlelabError, match=needle):
            resolve_config("cpu-tiny", ["visual.enabled=true", *extra], dp=0 if "dct" in extra[0] else 8)


@pytest.mark.slow
def test_visual_study_quick_on_the_sweep_engine(tmp_path, capsys):
    out = tmp_path / "vs"
    assert main(["visual-study", "--quick", "--methods", "none,random,oracle", "--out", str(out), "--no-progress"]) == 0
    md = (out / "report" / "report.md").read_text()
    assert "| oracle | 1.000 | 0.000 (" in md and "content-word loss" in md and "image removed" in md
    assert "the visual table next to the text table" in md and "| oracle | visual | 37 / 64 |" in md
    assert "## Findings" in md and "visual_contrast.png" in md and (out / "report" / "diagnostics.csv").exists()
    assert "Labels at other margins (δ-sensitivity)" in md and "plelab's default for this study; fixed in the analysis plan before the runs" in md
    data = json.loads((out / "report" / "results.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    assert [r["method"] for r in data["analysis"]["rows"]] == ["none", "random", "oracle"]
    assert {c["b"] for c in data["analysis"]["content_vs_none"]} == {"random", "oracle"}
    assert all(c["n"] == 2 for c in data["analysis"]["caption_vs_none"])
    rows = {(r["method"], r["table"]): r for r in data["analysis"]["tables"]}
    assert set(rows) == {("none", "text"), ("random", "text"), ("random", "visual"), ("oracle", "text"),
                         ("oracle", "visual")}
    assert not rows[("random", "visual")]["structure"].startswith("LEARNED")  # the null's Δ: no agreement
    assert all(math.isfinite(r["cka"]) for r in rows.values())  # cross-seed CKA read from the checkpoints
    assert all(len(r["structure_pairs"]) == 1 for r in rows.values())  # 2 seeds: one pair, counted once
    gate = data["analysis"]["gate"]  # oracle vs random on content words, paired by seed, gates the study
    assert gate["status"] in ("informative", "uninformative") and gate["comparison"]["n"] == 2
    first = md.split("## Findings", 1)[1].split("\n- ", 2)[1]
    assert first.startswith("**Positive control passed**" if gate["status"] == "informative" else "**UNINFORMATIVE**")
    assert "data:image/png;base64," in (out / "report" / "report.html").read_text()
    capsys.readouterr()
    assert main(["report", str(out)]) == 0 and "report.html" in capsys.readouterr().out  # dispatches by kind
    assert main(["visual-study", "--quick", "--methods", "random,oracle", "--out", str(tmp_path / "x")]) == 2
    assert "including none" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.background("visual_oracle")
def test_oracle_beats_random_ids_on_content_words_when_the_ids_are_the_only_view(background):
    """The positive control: with the continuous features withheld, a visual table keyed by the patch
    labels lowers the content-word loss far below one keyed by random IDs (measured: −0.35 and −0.30
    nats for seeds 0 and 1 at these settings). It needs ≥ 2 layers after the first injection: at
    L = 2 the table's signal can be read by one attention layer only and does not show in 300 steps.
    Both runs train beside the suite (tests/background.py:visual_oracle, 300 steps each)."""
    runs = json.loads((background("visual_oracle") / "results.json").read_text())
    content = {ids: run["content"] for ids, run in runs.items()}
    tables = {ids: run["table"] for ids, run in runs.items()}
    assert content["oracle"] < content["random"] - 0.1, content
    # the use test sees it too: scrambling the oracle table's rows costs content words, the random one's nothing
    assert tables["oracle"]["use_verdict"] == "USED" and tables["oracle"]["use"]["permute"]["content"]["delta"] > 0.1
    assert tables["random"]["use_verdict"] == "UNUSED", tables["random"]["use"]


def test_table_diagnostics_regenerate_w0_and_decay_exactly(prepared, tmp_path):
    """Δ = W_t − αW_0 must be exactly 0 on rows never looked up: W_0 regenerated from the names and seed, α
    from the schedule — also for the visual table when the text table is frozen (no text table group)."""
    from plelab.visual.diagnostics import initial_tables, load_run_tables

    cfg = _cfg("oracle", steps=12, extra=["train.table_weight_decay=0.1", "ple.table=frozen"])
    tr = VisualTrainer(cfg, prepared["oracle"], tmp_path / "r", progress=False, log=lambda *x: None)
    w0 = initial_tables(tr.cfg, tr.model.num_ids)
    assert torch.equal(w0["visual"], tr.model.visual_embed_tokens_per_layer.weight.detach())
    assert torch.equal(w0["text"], tr.model.lm.model.embed_tokens_per_layer.weight.detach())
    tr.fit()
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())["visual"]["tables"]
    assert set(summary) == {"visual"}  # the frozen text table is not diagnosed, the learned visual one is
    tables = load_run_tables(tmp_path / "r" / "checkpoints" / "step-000012")
    delta, counts = tables["visual"]
    unused = counts == 0
    assert unused.sum() > 10 and delta[torch.from_numpy(unused)].abs().max() < 1e-6
    assert delta[torch.from_numpy(~unused)].abs().max() > 1e-3 and "text" not in tables
