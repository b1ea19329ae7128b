"""Structure metrics against their random nulls, planted structure, and CKA."""

import math

import numpy as np
import pytest
import torch

from plelab.diagnostics.structure import (
    gaussian_null,
    linear_cka,
    matrix_stats,
    mp_erank_ratio,
    mp_pc1,
    residual_after,
)


@pytest.mark.parametrize("n, d", [(256, 64), (4096, 64), (600, 300)])
def test_random_matrices_match_their_nulls(n, d):
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(123)) * 0.02  # scale must not matter
    s = matrix_stats(x, chunk_rows=1000)  # streamed in several chunks
    null = gaussian_null(n, d, seed=7)
    assert s.erank_raw == pytest.approx(null.erank_raw, rel=0.01)
    assert s.erank_centred == pytest.approx(null.erank_centred, rel=0.01)
    assert s.erank_raw / min(n, d) == pytest.approx(mp_erank_ratio(n, d), rel=0.01)
    pc1_nulls = [gaussian_null(n, d, seed=k).pc1 for k in range(20)]
    assert min(pc1_nulls) * 0.98 <= s.pc1 <= max(pc1_nulls) * 1.02
    assert s.pc1 == pytest.approx(mp_pc1(n, d), rel=0.15)
    se = 1 / math.sqrt(d) / math.sqrt(n * (n - 1) / 2)  # std of one pair / sqrt(#pairs)
    assert abs(s.mean_cos) < 4 * se
    assert s.mean_abs_cos == pytest.approx(math.sqrt(2 / (math.pi * d)), rel=0.05)


@pytest.mark.slow
def test_reference_table_values():
    # visual_tokenizers_and_diagnostics.md §4.6: N=4096, d=256 -> erank 253.9, PC1 0.0061
    s = gaussian_null(4096, 256, seed=0)
    assert s.erank_raw == pytest.approx(253.9, abs=0.5) and s.pc1 == pytest.approx(0.0061, rel=0.05)
    assert mp_erank_ratio(256, 256) == pytest.approx(0.805, abs=0.002)


def test_planted_low_rank_is_recovered():
    gen = torch.Generator().manual_seed(0)
    n, d, k = 2000, 64, 4
    low = torch.randn(n, k, generator=gen) @ torch.randn(k, d, generator=gen)
    s = matrix_stats(low + 0.01 * torch.randn(n, d, generator=gen))
    null = gaussian_null(n, d)
    assert s.erank_centred < 6 and null.erank_centred > 60
    assert s.pc1 > 5 * null.pc1


def test_planted_clusters_are_recovered():
    gen = torch.Generator().manual_seed(1)
    centres = torch.randn(5, 32, generator=gen) * 3
    rows = centres[torch.arange(1000) % 5] + 0.3 * torch.randn(1000, 32, generator=gen)
    s = matrix_stats(rows)
    null = gaussian_null(1000, 32)
    assert s.mean_abs_cos > 2 * null.mean_abs_cos
    assert s.erank_centred < 0.4 * null.erank_centred  # 5 clusters span 4 centred directions
    assert s.pc1 > 5 * null.pc1


def test_shared_mean_direction_shows_in_raw_not_centred_erank():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3000, 48, generator=gen) + 5 * torch.randn(48, generator=gen)
    s = matrix_stats(x)
    assert s.mean_cos > 0.8
    assert s.erank_raw < 0.5 * s.erank_centred


def test_cka_is_rotation_invariant_and_null_is_small():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(800, 24, generator=gen)
    q, _ = torch.linalg.qr(torch.randn(24, 24, generator=gen))
    assert linear_cka(x, 3.0 * x @ q) == pytest.approx(1.0, abs=1e-9)
    assert linear_cka(x, torch.randn(800, 24, generator=gen)) < 0.1


def test_residual_removes_what_a_covariate_explains():
    gen = torch.Generator().manual_seed(4)
    f = torch.from_numpy(np.log1p(np.arange(500.0)))
    x = torch.outer(f, torch.randn(8, generator=gen).double()) + 0.001 * torch.randn(500, 8, generator=gen).double()
    r = residual_after(x, f)
    assert r.norm() < 0.01 * x.norm()


def test_frequency_only_agreement_needs_the_matched_null_pair():
    """Two 'seeds' whose change is a shared function of row frequency only (no identity
    information). A smooth function of log-frequency is removed by the regression; a heavy-tailed
    √f is not — then only the matched null-run pair (same frequencies) stops a LEARNED verdict."""
    from plelab.diagnostics.agreement import cka_against_null
    from plelab.diagnostics.verdict import LEARNED, structure_verdict

    rng = np.random.default_rng(0)
    n, d = 400, 32
    f = rng.zipf(1.3, size=n).astype(float).clip(1, 1e5)

    def fake(seed, fn):
        g = torch.randn(d, generator=torch.Generator().manual_seed(seed)).double()
        noise = torch.randn(n, d, generator=torch.Generator().manual_seed(seed + 10)).double()
        return torch.from_numpy(fn(f))[:, None] * g[None, :] + 0.5 * noise

    smooth = cka_against_null(fake(1, np.log1p), fake(2, np.log1p), f)
    assert structure_verdict(smooth["cka"], smooth["null_mean"], smooth["null_sd"])[0] != LEARNED
    rough = cka_against_null(fake(1, np.sqrt), fake(2, np.sqrt), f)
    pair = cka_against_null(fake(3, np.sqrt), fake(4, np.sqrt), f)["cka"]  # the matched null runs
    assert structure_verdict(rough["cka"], rough["null_mean"], rough["null_sd"], null_run_cka=pair)[0] != LEARNED


@pytest.mark.parametrize("seen", [16, 20, 40, 47, 64])
def test_within_bin_permutation_is_a_permutation_inside_frequency_bins(seen):
    """Regression: a short last bin used to be merged into the wrong bin (rows duplicated and dropped)."""
    from plelab.diagnostics.usage import frequency_bins, within_bin_permutation

    counts = np.concatenate([np.zeros(5), np.arange(1, seen + 1)])[np.random.default_rng(0).permutation(seen + 5)]
    bins = frequency_bins(counts)
    assert sorted(np.concatenate(bins).tolist()) == list(range(len(counts)))  # each row in exactly one bin
    assert all(len(b) >= 16 for b in bins if counts[b[0]] > 0) or seen < 16
    perm = within_bin_permutation(counts, seed=1).numpy()
    assert sorted(perm.tolist()) == list(range(len(counts)))
    for b in bins:
        assert set(perm[b].tolist()) == set(b.tolist())
    top = np.argsort(counts)[-16:]  # the most frequent rows are shuffled too
    assert (perm[top] != top).any()
