"""`plelab diagnose` on checkpoints plelab did not train: two seeds of an attached HF model, saved with
save_pretrained at step 0 and after training, compared by cross-seed agreement (Δ with --init, W_t without)."""

from __future__ import annotations

import json

import pytest
import torch
from hf_models import VOCAB, tiny_host

import plelab
from plelab.cli import main


def structured(seed: int, n: int, t: int = 17) -> torch.Tensor:
    """Sequences where each token mostly determines the next (a table row can learn what its token predicts)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.empty(n, t, dtype=torch.long)
    x[:, 0] = torch.randint(0, VOCAB, (n,), generator=g)
    for i in range(1, t):
        jump = torch.randint(0, VOCAB, (n,), generator=g)
        keep = torch.rand(n, generator=g) < 0.8
        x[:, i] = torch.where(keep, (x[:, i - 1] * 7 + 3) % VOCAB, jump)
    return x


def train_pair(root, iid: bool = False, steps: int = 150):
    """Two seeds, each saved at step 0 (``s{seed}-init``) and after ``steps`` (``s{seed}``)."""
    data = structured(0, 8 * steps)
    for seed in (0, 1):
        model = plelab.attach(tiny_host(), 8, seed=seed, init="gemma")
        model.save_pretrained(root / f"s{seed}-init")
        opt = plelab.adamw(plelab.param_groups(model, lr=1e-2))
        ids_gen = torch.Generator().manual_seed(1000 + seed)  # the null control: rows drawn i.i.d., per seed
        for step in range(steps):
            ids = data[8 * step:8 * step + 8]
            extra = {"table_ids": torch.randint(0, VOCAB, ids.shape, generator=ids_gen)} if iid else {}
            model(ids, labels=ids, **extra).loss.backward()
            opt.step()
            opt.zero_grad()
        model.save_pretrained(root / f"s{seed}")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    real, null = tmp_path_factory.mktemp("real"), tmp_path_factory.mktemp("iid")
    train_pair(real)
    train_pair(null, iid=True)
    return real, null


def diagnose_json(tmp_path, *argv) -> dict:
    out = tmp_path / "d"
    assert main(["diagnose", *map(str, argv), "--no-progress", "--out", str(out)]) == 0
    return json.loads((out / "diagnostics.json").read_text())


def test_delta_agreement_of_a_real_pair_beats_an_iid_pair(pairs, tmp_path):
    real, null = pairs
    reps = [diagnose_json(tmp_path / p.name, p / "s0", "--reference", p / "s1", "--init", p / "s0-init",
                          "--reference-init", p / "s1-init") for p in (real, null)]
    for rep in reps:
        table = rep["table"]
        assert table["basis"] == "Δ = W_t − W_0" and table["cross_seed"]["null"].startswith("rows permuted among all")
        assert table["verdict"]["use"] == "UNDECIDED" and "use test not available" in table["verdict"]["reasons"][1]
        assert len(rep["layers"]) == 2 and all("cross_seed" in layer for layer in rep["layers"])
    excess = [r["table"]["cross_seed"]["cka"] - r["table"]["cross_seed"]["null_mean"] for r in reps]
    assert excess[0] > excess[1] + 0.02  # real ids: the two seeds' changes agree beyond what i.i.d. ids give
    assert reps[1]["table"]["verdict"]["structure"] != "LEARNED"


def test_without_init_it_compares_wt_and_says_so(pairs, tmp_path):
    real, _ = pairs
    rep = diagnose_json(tmp_path, real / "s0", "--reference", real / "s1")
    assert rep["table"]["basis"] == "W_t (no W_0 given)"
    assert "independent initialisations" in rep["table"]["verdict"]["reasons"][0]


@pytest.mark.parametrize("extra, needle", [
    (["--init", "{real}/s0-init"], "--init and --reference-init go together"),
    (["--init", "{real}/s0-init", "--reference-init", "{small}"], "has a table of shape"),
])
def test_bad_foreign_comparisons_are_refused(pairs, tmp_path, capsys, extra, needle):
    real, _ = pairs
    small = tmp_path / "small"
    plelab.attach(tiny_host(), 4).save_pretrained(small)
    capsys.readouterr()
    argv = ["diagnose", str(real / "s0"), "--reference", str(real / "s1"), "--no-progress",
            *[a.format(real=real, small=small) for a in extra]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_a_reference_with_other_rows_is_refused(pairs, tmp_path, capsys):
    real, _ = pairs
    other = tmp_path / "other"
    plelab.attach(tiny_host(), 8, vocab_size=VOCAB // 2).save_pretrained(other)
    capsys.readouterr()
    assert main(["diagnose", str(real / "s0"), "--reference", str(other), "--no-progress"]) == 2
    assert "rows must be the same token ids" in capsys.readouterr().err
