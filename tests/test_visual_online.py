"""Online quantizers inside visual runs: online vs frozen arms, flips, resume, and the study's table."""

from __future__ import annotations

import json
import time

import pytest
import torch

from plelab.cli import main
from plelab.config import resolve_config
from plelab.runs import make_trainer as VisualTrainer
from plelab.visual.data import prepare_visual

VIS = ["visual.enabled=true", "visual.scenes=200", "visual.val_scenes=40", "visual.encoder_steps=30",
       "train.batch_size=16", "train.eval_every=5", "train.diag_every=0", "train.warmup_steps=5",
       "visual.quantizer_batch=8"]


def _cfg(ids: str, online: bool, steps: int = 15, extra=()):
    return resolve_config("cpu-tiny", [*VIS, f"visual.ids={ids}", f"visual.online={str(online).lower()}", *extra],
                          dp=8, steps=steps, seed=0)


def _quiet(*_):
    return None


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["vq", "lfq", "bsq"])
def test_online_and_frozen_arms_end_with_the_same_quantizer_and_only_online_flips(kind):
    online = VisualTrainer(_cfg(kind, True), prepare_visual(_cfg(kind, True)), progress=False, log=_quiet)
    online.fit()
    frozen_data = prepare_visual(_cfg(kind, False))
    frozen = VisualTrainer(_cfg(kind, False), frozen_data, progress=False, log=_quiet)
    frozen.fit()
    a, b = online.task.qt.quantizer.state_dict(), frozen_data.quantizer.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)  # same stream, same steps: the same final quantizer
    assert torch.equal(online.task.val_ids, frozen_data.val_ids)  # so the final validation IDs agree too
    on, fr = online.task.id_stability(), frozen.task.id_stability()
    assert on["intervals"] == fr["intervals"] == 3
    assert on["flip_rate"] > 0 and fr["flip_rate"] == 0.0  # the frozen quantizer is metered and never flips
    summary = online.task.summary(online.model, online.step, online.row_counts())
    assert summary["visual"]["id_metrics"]["nmi"] == pytest.approx(frozen_data.id_metrics["nmi"])


def test_quantizer_training_does_not_depend_on_the_thread_count():
    """A sweep worker runs on 1 thread, an in-process run on 2: the frozen quantizer must come out the same."""
    from plelab.visual.online import patch_pixels, pretrained_frozen
    from plelab.visual.scenes import generate_scenes

    cfg = _cfg("lfq", False, steps=30)
    scenes = generate_scenes(64, 0, 48, 8)
    pixels = patch_pixels(scenes.images, 8)
    feats = torch.randn(64, 36, 64, generator=torch.Generator().manual_seed(0))
    threads, states = torch.get_num_threads(), []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            states.append(pretrained_frozen(cfg, feats, pixels).state_dict())
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


@pytest.mark.slow
def test_an_online_run_resumes_exactly(tmp_path):
    extra = ["train.checkpoint_every=5"]
    data = prepare_visual(_cfg("vq", True, extra=extra))
    whole = VisualTrainer(_cfg("vq", True, extra=extra), data, tmp_path / "a", progress=False, log=_quiet)
    result = whole.fit()
    part = VisualTrainer(_cfg("vq", True, extra=extra), data, tmp_path / "b", progress=False, log=_quiet)
    part._start = time.perf_counter()
    for _ in range(7):
        part.train_step()
        if part.step % 5 == 0:
            part.evaluate()
    part.save_checkpoint()  # killed right after step 7's checkpoint
    part.release()  # its lock on the folder, as a killed process's goes
    rest = VisualTrainer(_cfg("vq", True, extra=extra), data, tmp_path / "b", resume=True, progress=False,
                         log=_quiet)
    assert rest.task.qt.steps == 7
    out = rest.fit()
    assert out.train_losses == result.train_losses[7:] and out.val_history[-1] == result.val_history[-1]
    a, b = whole.task.qt.quantizer.state_dict(), rest.task.qt.quantizer.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert whole.task.qt.quantizer.restarts == rest.task.qt.quantizer.restarts
    assert [r["flip_rate"] for r in whole.task.flips.rows] == [r["flip_rate"] for r in rest.task.flips.rows]


def test_lfq_needs_a_power_of_two():
    from plelab.errors import PlelabError

    with pytest.raises(PlelabError, match="power of two"):
        resolve_config("cpu-tiny", [*VIS, "visual.ids=lfq", "visual.k=48"], dp=8)


@pytest.mark.slow
def test_visual_study_compares_online_with_frozen(tmp_path, capsys):
    out = tmp_path / "vs"
    assert main(["visual-study", "--quick", "--methods", "none,vq-online,vq-frozen", "--out", str(out),
                 "--no-progress", "--no-gate"]) == 0
    md = (out / "report" / "report.md").read_text()
    arms = [a["name"] for a in json.loads((out / "sweep.json").read_text())["arms"]]
    assert "**Ungated**" in md and arms == ["none", "vq-online", "vq-frozen"]  # --no-gate: no oracle, no random
    assert "Online vs frozen quantizers: the cost of ID flips" in md and "\n| vq | " in md
    data = json.loads((out / "report" / "results.json").read_text())
    rows = {r["method"]: r for r in data["analysis"]["rows"]}
    assert rows["vq-online"]["flip_rate"] > 0 and rows["vq-frozen"]["flip_rate"] == 0
    assert [c["b"] for c in data["analysis"]["online_vs_frozen"]["content"]] == ["vq-online"]


def test_a_nonfinite_step_is_replayed_without_moving_the_quantizer_or_the_counts():
    """Locating a NaN re-runs the step's forward: with the step's own IDs, no quantizer step, no row counts."""
    from plelab.errors import PlelabError

    cfg = _cfg("vq", True, steps=6, extra=["train.grad_accum=2"])
    tr = VisualTrainer(cfg, prepare_visual(cfg), progress=False, log=_quiet)
    for _ in range(3):
        tr.train_step()
    tr.model.lm.model.layers[1].mlp.up_proj.weight.data[0, 0] = float("inf")
    steps, counts = tr.task.qt.steps, tr.task.visual_rows.counts.clone()
    with pytest.raises(PlelabError, match=r"at step 4; first non-finite output: .*layers\.1\.mlp\.up_proj \(layer 1\)"):
        tr.train_step()
    assert tr.task.qt.steps == steps + 1  # the real step's one quantizer step, none from the replay
    assert int(tr.task.visual_rows.counts.sum() - counts.sum()) == 16 * tr.task.data.num_patches  # counted once
