"""The instruments the calibration's truths use, apart from the calls they score: validation windows that share no
token with the evaluation's, the bin-mean ablation (another intervention than the use test's permutation), and a
table that never moved, diagnosed through the path a user runs (a pair given --reference gets a computed z)."""

import numpy as np
import torch

from plelab.config import resolve_config
from plelab.data.tokens import disjoint_val_windows, val_windows
from plelab.diagnostics.agreement import cka_against_null
from plelab.diagnostics.diagnose import diagnose_run as diagnose
from plelab.diagnostics.usage import ablation_losses, bin_mean_rows, frequency_bins
from plelab.diagnostics.verdict import LEARNED, UNDECIDED
from plelab.model.init import build_model
from plelab.model.ple import PLEModules
from plelab.runs import train


def _positions(windows: torch.Tensor, stream: np.ndarray, seq_len: int) -> set[int]:
    """Token positions of ``windows`` in ``stream`` (each window starts at a multiple of seq_len)."""
    out = set()
    for w in windows:
        starts = [i for i in range(0, len(stream) - seq_len, seq_len)
                  if np.array_equal(stream[i:i + seq_len + 1], w.numpy())]
        assert len(starts) >= 1
        out |= set(range(starts[0], starts[0] + seq_len + 1))
    return out


def test_disjoint_windows_share_no_token_with_the_evaluation():
    stream = np.arange(64 * 100 + 1, dtype=np.int64)  # distinct ids: a window's position is its content
    used = val_windows(stream, 64, 12)
    free = disjoint_val_windows(stream, 64, 8, avoid=12)
    assert free.shape == (8, 65)
    assert not _positions(used, stream, 64) & _positions(free, stream, 64)
    assert len(disjoint_val_windows(stream, 64, 1000, avoid=12)) <= 100 - 12 * 3 + 2  # neighbours skipped
    try:
        disjoint_val_windows(stream[:64 * 3 + 1], 64, 4, avoid=3)
    except Exception as err:  # every slot is an evaluation window or its neighbour
        assert "no window outside" in str(err)
    else:
        raise AssertionError("expected a refusal")


def test_bin_mean_ablation_removes_only_what_distinguishes_rows_of_a_bin():
    counts = np.array([0, 0, 5, 5, 9, 9, 9, 1], dtype=np.int64)
    weight = torch.arange(16, dtype=torch.float32).view(8, 2)
    out = bin_mean_rows(weight, counts, bin_size=3)
    for b in frequency_bins(counts, 3):
        rows = torch.from_numpy(np.asarray(b))
        assert torch.allclose(out[rows], weight[rows].mean(0).expand(len(b), 2))
    assert torch.allclose(out.mean(0), weight.mean(0))  # the first moment is kept
    cfg = resolve_config("cpu-tiny", ["ple.dim=4"])
    model = build_model(cfg.model, cfg.ple, seed=0)
    table = PLEModules(model).table
    counts = np.random.default_rng(0).integers(1, 50, table.shape[0])
    windows = torch.randint(0, cfg.model.vocab_size, (4, 17))
    before = table.detach().clone()
    diff = ablation_losses(model, windows, counts, batch=2, device=torch.device("cpu"))
    assert diff.shape == (4,) and bool(diff.ne(0).any()) and torch.equal(table.detach(), before)  # restored
    with torch.no_grad():  # rows already equal to their bin means: nothing to remove, exactly 0
        table.copy_(bin_mean_rows(table, counts))
    assert bool(ablation_losses(model, windows, counts, batch=2, device=torch.device("cpu")).eq(0).all())


def test_a_table_that_never_moved_agrees_with_nothing():
    zeros = torch.zeros(30, 4)
    res = cka_against_null(zeros, zeros, np.arange(30))
    assert (res["cka"], res["null_mean"], res["null_sd"]) == (0.0, 0.0, 0.0) and "never moved" in res["note"]


def test_a_frozen_pair_with_reference_gets_a_computed_structure_call(tmp_path, tiny_data):
    paths = []
    for seed in (0, 1):
        cfg = resolve_config("cpu-tiny", ["ple.table=frozen", "train.checkpoint_every=0", "train.eval_every=6",
                                          "train.diag_every=0"], seed=seed, steps=6)
        paths.append(tmp_path / f"frozen-{seed}")
        train(cfg, paths[-1], data=tiny_data, progress=False, log=lambda *a: None)
    rep = diagnose(paths[0], reference=paths[1], use=False, progress=False)
    cs = rep["table"]["cross_seed"]
    assert cs is not None and cs["cka"] == 0.0 and cs["null_sd"] == 0.0
    v = rep["table"]["verdict"]
    assert v["structure"] in (UNDECIDED, "NOT DISTINGUISHABLE FROM NULL") and v["structure"] != LEARNED
    assert "no second seed" not in v["reasons"][0] and "z 0.0" in v["reasons"][0]
    assert any("never moved" in n or "Δ = 0" in n for n in rep["notes"])
