"""Online quantizers (VQ-VAE, LFQ, BSQ) and the ID-flip meter, on small controlled cases."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from plelab.errors import PlelabError
from plelab.visual.flips import FlipMeter, flip_stats
from plelab.visual.quantizers import BSQQuantizer, LFQQuantizer, VQQuantizer, bits_to_ids, build_quantizer

D, PIX, K = 12, 20, 16


@pytest.fixture
def batch():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(64, D, generator=gen), torch.randn(64, PIX, generator=gen)


@pytest.mark.parametrize("kind", ["vq", "lfq", "bsq"])
def test_shapes_losses_and_straight_through_gradients(kind, batch):
    feats, pix = batch
    q = build_quantizer(kind, D, K, PIX, seed=0)
    ids, losses = q(feats, pix)
    assert ids.shape == (64,) and ids.dtype == torch.long and 0 <= ids.min() and ids.max() < K
    assert {"reconstruction", "commitment", "total"} <= set(losses) and torch.isfinite(losses["total"])
    losses["reconstruction"].backward()  # the table lookup is not differentiable: only this path reaches z
    assert q.encoder.weight.grad is not None and q.encoder.weight.grad.abs().sum() > 0
    assert torch.equal(q.assign(feats), q.assign(feats))  # assign changes nothing


def test_lfq_bits_are_big_endian_and_commitment_is_exact():
    assert bits_to_ids(torch.tensor([[True, False, False, False], [False, False, False, True]])).tolist() == [8, 1]
    q = LFQQuantizer(D, K, PIX)
    z = torch.tensor([[0.5, -0.2, 0.0, 2.0]])  # an exact 0 maps to −1
    code, ids, losses = q.quantize(z)
    assert ids.tolist() == [0b1001] and code.tolist() == [[1.0, -1.0, -1.0, 1.0]]
    assert losses["commitment"].item() == pytest.approx(0.25 * F.mse_loss(z, code).item())


def test_lfq_entropy_terms_on_controlled_cases():
    q = LFQQuantizer(D, K, PIX)
    confident_uniform = q.corners * 5  # one sample at every corner, far from the boundaries
    h_s, h_b = q.entropies(confident_uniform)
    assert h_s.item() < 1e-3 and h_b.item() == pytest.approx(math.log(K), abs=1e-3)
    collapsed = torch.ones(8, 4) * 5  # every sample at the same corner: no codebook entropy
    assert q.entropies(collapsed)[1].item() < 1e-3
    z = torch.randn(32, 4, requires_grad=True)  # the entropy term trains z towards confident, diverse codes
    q.quantize(z)[2]["entropy"].backward()
    assert z.grad.abs().sum() > 0


def test_bsq_codes_lie_on_the_sphere_and_entropy_is_factorised():
    q = BSQQuantizer(D, K, PIX)
    z = torch.randn(32, 4) * 3
    code, ids, losses = q.quantize(z)
    assert torch.allclose(code.norm(dim=1), torch.ones(32))
    assert torch.equal(ids, bits_to_ids(z > 0)) and losses["commitment"].item() == 0.0  # β = 0 (released configs)
    u = F.normalize(z, dim=-1)
    p = torch.sigmoid(4 * u / 2)
    h = -(p * p.log() + (1 - p) * (1 - p).log())
    h_s, h_b = q.entropies(u)
    assert h_s.item() == pytest.approx(h.sum(1).mean().item(), rel=1e-5)
    pm = p.mean(0)
    assert h_b.item() == pytest.approx((-(pm * pm.log() + (1 - pm) * (1 - pm).log())).sum().item(), rel=1e-5)
    with pytest.raises(PlelabError, match="power of two"):
        BSQQuantizer(D, 24, PIX)


def test_vq_ema_moves_codes_to_their_mean_and_restarts_dead_codes():
    q = VQQuantizer(2, 4, PIX, code_dim=2, decay=0.0, restart_threshold=0.5, seed=0)
    q.encoder = torch.nn.Identity()
    with torch.no_grad():
        q.codebook.copy_(torch.tensor([[10.0, 10.0], [-10.0, -10.0], [50.0, 50.0], [-50.0, 50.0]]))
    q.initialised.fill_(True)  # a hand-set codebook: skip the first-batch initialisation
    z = torch.tensor([[9.0, 9.0], [11.0, 12.0], [-9.0, -10.0]])
    ids, losses = q(z)
    assert ids.tolist() == [0, 0, 1]  # IDs from the codebook before the update
    assert torch.allclose(q.codebook[0], torch.tensor([10.0, 10.5]), atol=1e-3)  # γ = 0: the batch mean
    assert torch.allclose(q.codebook[1], torch.tensor([-9.0, -10.0]), atol=1e-3)
    assert q.restarts == [(1, [2, 3])]  # the two unused codes, logged with the step
    assert all(any(torch.equal(q.codebook[c], row) for row in z) for c in (2, 3))  # restarted from batch vectors
    assert losses["commitment"].item() == pytest.approx(0.25 * F.mse_loss(z, torch.tensor(
        [[10.0, 10.0], [10.0, 10.0], [-10.0, -10.0]])).item())


def test_vq_codebook_starts_from_the_first_batch(batch):
    q = VQQuantizer(D, K, PIX, seed=0)
    feats, pix = batch
    ids, _ = q(feats, pix)
    assert bool(q.initialised) and len(set(ids.tolist())) > K // 2  # most codes in use from the start
    assert q.restarts == []  # counts start at the batch's mean cluster size: nothing is dead after step 1


def test_vq_gradient_codebook_variant_has_a_codebook_loss(batch):
    q = VQQuantizer(D, K, PIX, ema=False)
    _, losses = q(*batch)
    losses["codebook"].backward()
    assert q.codebook.grad is not None and q.codebook.grad.abs().sum() > 0


@pytest.mark.parametrize("kind", ["vq", "lfq", "bsq"])
def test_frozen_quantizers_are_deterministic_and_flip_nothing(kind, batch):
    feats, pix = batch
    a, b = build_quantizer(kind, D, K, PIX, seed=3), build_quantizer(kind, D, K, PIX, seed=3)
    assert torch.equal(a.assign(feats), b.assign(feats))
    meter = FlipMeter(feats, K)
    for step in (0, 10, 20):
        meter.record(step, a)
    assert meter.summary()["flip_rate"] == 0.0 and meter.summary()["intervals"] == 2


def test_flip_stats_on_a_constructed_case():
    old = torch.tensor([0, 1, 2, 3] * 5)
    new = old.clone()
    new[:3] = torch.tensor([1, 0, 3])  # three flips: 0→1, 1→0, 2→3
    out = flip_stats(old, new, 4, restarted={3}, bits=2)
    assert out["flip_rate"] == pytest.approx(3 / 20) and out["chance"] == pytest.approx(0.75)
    assert out["restart_flip_rate"] == pytest.approx(1 / 20)  # 2→3 touches the restarted code
    assert out["boundary_flip_rate"] == pytest.approx(2 / 20)
    # bits (big-endian, 2 bits): 0→1 flips bit 1; 1→0 flips bit 1; 2→3 flips bit 1
    assert out["bit_flip_rate"] == pytest.approx([0.0, 3 / 20]) and out["mean_hamming"] == pytest.approx(3 / 20)


def test_flip_meter_sees_training_move_an_online_quantizer(batch):
    feats, pix = batch
    q = build_quantizer("lfq", D, K, PIX, seed=0)
    opt = torch.optim.Adam(q.parameters(), lr=0.05)
    meter = FlipMeter(feats, K)
    meter.record(0, q)
    for _ in range(20):
        _, losses = q(feats, pix)
        opt.zero_grad()
        losses["total"].backward()
        opt.step()
    row = meter.record(20, q)
    assert 0 < row["flip_rate"] <= 1 and len(row["bit_flip_rate"]) == 4 and row["median_margin"] > 0


def test_lfq_matches_vector_quantize_pytorch_when_installed():
    """Optional oracle (not a dependency): the same IDs and codes as lucidrains' LFQ on the same latents."""
    vqp = pytest.importorskip("vector_quantize_pytorch")
    z = torch.randn(1, 32, 4, generator=torch.Generator().manual_seed(0))
    theirs = vqp.LFQ(dim=4, codebook_size=K, entropy_loss_weight=0.1, diversity_gamma=1.0,
                     commitment_loss_weight=0.25).eval()
    quantized, indices, _ = theirs(z)
    code, ids, _ = LFQQuantizer(D, K, PIX).quantize(z[0])
    assert torch.equal(ids, indices[0].long()) and torch.allclose(code, quantized[0])
