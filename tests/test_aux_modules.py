"""The token-indexed tables beside PLE: value embeddings, the hashed n-gram table, token modulation.

Each module's output is checked against loops written here, its function-preserving start against an exact zero,
its accounting against the module and a number counted by hand, and the n-gram hash against the documented rule
re-implemented here in plain Python integers.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from plelab.model import modulation, ngram, value_embed
from plelab.model.modulation import TokenModulation
from plelab.model.ngram import HashedNgramEmbedding, count_collisions, ngram_ids, ngram_rows
from plelab.model.value_embed import ValueEmbeddings, value_embed_layers

M64 = (1 << 64) - 1
PAD = (1 << 32) - 1


def _sm(z):
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def _mult(seed, n, k, j):
    """ngram.py's documented rule: (S(S(S(S(seed) ^ n) ^ k) ^ j) >> 34) | 1."""
    return (_sm(_sm(_sm(_sm(seed & M64) ^ n) ^ k) ^ j) >> 34) | 1


def _ref_ids(x, rows, orders, heads, seed):
    """Bucket ids by the module doc's equation, one position at a time, in Python integers."""
    out = []
    for seq in x.tolist():
        row = []
        for t in range(len(seq)):
            slots = []
            for n in orders:
                for k in range(heads):
                    mix = 0
                    for j in range(n):
                        tok = seq[t - j] if t - j >= 0 else PAD
                        mix ^= tok * _mult(seed, n, k, j)
                    slots.append(mix % rows)
            row.append(slots)
        out.append(row)
    return torch.tensor(out, dtype=torch.int64)


# ---------------------------------------------------------------------------------------------- value embeddings


def test_value_embed_layers_follow_nanochats_rule():
    assert value_embed_layers(1) == (0,)
    assert value_embed_layers(2) == (1,)
    assert value_embed_layers(4) == (1, 3)
    assert value_embed_layers(5) == (0, 2, 4)
    assert value_embed_layers(12) == (1, 3, 5, 7, 9, 11)
    with pytest.raises(ValueError, match="num_layers >= 1"):
        value_embed_layers(0)


def test_value_embeddings_names_and_shapes():
    ve = ValueEmbeddings(10, 4, num_kv_heads=2, head_dim=3, gate_channels=4)
    assert {k: tuple(v.shape) for k, v in ve.state_dict().items()} == {
        "embed.weight": (10, 12), "gates.1.weight": (2, 4), "gates.3.weight": (2, 4)}
    assert ValueEmbeddings(10, 4, 2, 3, layers=[2, 0]).layers == (0, 2)


def test_value_embeddings_forward_matches_loops():
    ve = ValueEmbeddings(7, 3, num_kv_heads=2, head_dim=3, gate_channels=4, gate_scale=2.5)
    ve.reset_parameters(torch.Generator().manual_seed(0), std=0.5, init="nanochat")
    with torch.no_grad():
        ve.gates["2"].weight.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(1))  # gates far from 1/2
    g = torch.Generator().manual_seed(2)
    x, ids = torch.randn(2, 5, 6, generator=g), torch.randint(0, 7, (2, 5), generator=g)
    out = ve(x, ids, 2)
    assert out.shape == (2, 2, 5, 3)
    W, E = ve.gates["2"].weight.detach(), ve.embed.weight.detach()[:, 6:12]  # layer 2: the second of (0, 2)
    expected = torch.empty(2, 2, 5, 3)
    for b in range(2):
        for t in range(5):
            for h in range(2):
                z = sum(float(W[h, c]) * float(x[b, t, c]) for c in range(4))
                gate = 2.5 / (1.0 + math.exp(-z))
                for d in range(3):
                    expected[b, h, t, d] = gate * float(E[int(ids[b, t]), h * 3 + d])
    torch.testing.assert_close(out, expected)


def test_value_embeddings_nanochat_init_ranges():
    ve = ValueEmbeddings(50, 2, 2, 8, gate_channels=12)
    ve.reset_parameters(torch.Generator().manual_seed(0), std=0.1, init="nanochat")
    table, gate = ve.embed.weight.detach(), ve.gates["1"].weight.detach()
    assert 0.0 < float(table.abs().max()) <= 3 ** 0.5 * 0.1 and abs(float(table.std()) - 0.1) < 0.01
    assert float(gate.min()) >= 0.0 and 0.0 < float(gate.max()) < 0.02


@pytest.mark.parametrize("sparse", [False, True])
def test_value_embeddings_start_at_zero_and_train_the_table(sparse):
    ve = ValueEmbeddings(9, 2, num_kv_heads=2, head_dim=4, gate_channels=3, sparse=sparse)
    g = torch.Generator().manual_seed(0)
    x, ids = torch.randn(2, 6, 5, generator=g), torch.tensor([[1, 4, 4, 0, 8, 1], [2, 2, 1, 0, 0, 4]])
    out = ve(x, ids, 1)
    assert torch.equal(out, torch.zeros_like(out))
    (out * torch.randn(out.shape, generator=g)).sum().backward()
    grad = ve.embed.weight.grad
    assert grad.is_sparse == sparse
    dense = grad.to_dense() if sparse else grad
    assert {int(r) for r in dense.abs().sum(1).nonzero()} == {0, 1, 2, 4, 8}
    if sparse:
        assert set(grad.coalesce().indices()[0].tolist()) == {0, 1, 2, 4, 8}
    assert torch.equal(ve.gates["1"].weight.grad, torch.zeros(2, 3))  # the gates move from the second step


def test_value_embeddings_accounting():
    shape = dict(vocab_size=10, num_layers=4, num_kv_heads=2, head_dim=3, gate_channels=4)
    # layers (1, 3): 2 · (10·2·3 + 4·2) = 136 parameters; 2 gates of 4·2 multiply-adds: 2 · 2 · 8 = 32 FLOPs
    assert value_embed.added_params(**shape) == 136
    assert value_embed.flops_per_token(**shape) == 32
    assert sum(p.numel() for p in ValueEmbeddings(**shape).parameters()) == 136
    assert value_embed.added_params(**shape, layers=[0]) == 68
    big = dict(vocab_size=300, num_layers=7, num_kv_heads=3, head_dim=5)
    assert value_embed.added_params(**big) == sum(p.numel() for p in ValueEmbeddings(**big).parameters())


def test_value_embeddings_refuse_bad_arguments():
    ve = ValueEmbeddings(10, 4, 2, 3, gate_channels=4)
    x, ids = torch.randn(1, 2, 8), torch.zeros(1, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="layer 2 has no value embedding"):
        ve(x, ids, 2)
    with pytest.raises(ValueError, match="first 4 channels of x, but x has only 3"):
        ve(torch.randn(1, 2, 3), ids, 1)
    with pytest.raises(ValueError, match=r"x \[B,T,H\] and ids \[B,T\]"):
        ve(x, torch.zeros(1, 3, dtype=torch.int64), 1)
    for layers in ([4], [1, 1], [], [-1]):
        with pytest.raises(ValueError, match="distinct layer indices"):
            ValueEmbeddings(10, 4, 2, 3, layers=layers)
    with pytest.raises(ValueError, match="unknown ValueEmbeddings init"):
        ve.reset_parameters(init="gemma")
    with pytest.raises(ValueError, match="gate_channels >= 1"):
        ValueEmbeddings(10, 4, 2, 3, gate_channels=0)


# ---------------------------------------------------------------------------------------------- hashed n-grams


def test_ngram_ids_match_the_documented_hash():
    x = torch.tensor([[3, 9, 3, 0, 11], [7, 7, 7, 2, 5]])
    got = ngram_ids(x, rows=97, orders=(2, 3), heads=2, seed=3)
    assert got.shape == (2, 5, 4) and got.dtype == torch.int64
    assert torch.equal(got, _ref_ids(x, 97, (2, 3), 2, 3))
    assert torch.equal(ngram_ids(x, rows=97, orders=(3,), heads=2, seed=3), got[..., 2:])  # orders independent


def test_ngram_ids_are_fixed_for_a_seed():
    """Pinned values: any process, any machine, any later version must give these (no hash(), no RNG state)."""
    x = torch.tensor([[5, 17, 5, 17, 99, 2]])
    assert ngram_ids(x, rows=1009, orders=(2, 3), seed=0)[0].tolist() == [
        [158, 945], [253, 84], [707, 524], [253, 568], [433, 303], [919, 276]]


def test_ngram_ids_depend_on_the_seed():
    x = torch.randint(0, 1000, (4, 64), generator=torch.Generator().manual_seed(0))
    a = ngram_ids(x, rows=ngram_rows(1000), seed=1)
    assert torch.equal(a, ngram_ids(x.clone(), rows=ngram_rows(1000), seed=1))
    assert float((a != ngram_ids(x, rows=ngram_rows(1000), seed=2)).float().mean()) > 0.9


def test_ngram_ids_are_causal():
    x = torch.randint(0, 500, (2, 10), generator=torch.Generator().manual_seed(0))
    base = ngram_ids(x, rows=100003, orders=(2, 3), heads=2, seed=0)
    for t in range(9):
        y = x.clone()
        y[:, t + 1] = (y[:, t + 1] + 1) % 500
        changed = ngram_ids(y, rows=100003, orders=(2, 3), heads=2, seed=0)
        assert torch.equal(changed[:, :t + 1], base[:, :t + 1])
        assert bool((changed[:, t + 1] != base[:, t + 1]).all())


def test_ngram_rows_avoid_multiples_of_the_vocabulary():
    assert ngram_rows(10) == 53  # round(5·10) = 50 -> the next prime
    assert ngram_rows(7, multiple=1.0) == 11  # 7 is prime but a multiple of 7
    for vocab in (2, 3, 7, 10, 97, 1000, 32768, 50257, 65536):
        for multiple in (0.5, 1.0, 2.0, 5.0):
            rows = ngram_rows(vocab, multiple)
            assert rows % vocab != 0 and rows >= round(multiple * vocab)
            assert all(rows % f for f in range(2, math.isqrt(rows) + 1))
    with pytest.raises(ValueError, match="at least 2 ids"):
        ngram_rows(1)
    with pytest.raises(ValueError, match="positive multiple"):
        ngram_rows(10, multiple=0.0)


def test_count_collisions_by_hand():
    tokens = torch.tensor([1, 2, 1, 2, 3])  # bigrams 12 21 12 23: 3 distinct; trigrams 121 212 123: 3 distinct
    one_row = count_collisions(tokens, rows=1)
    assert one_row == {2: {"ngrams": 3, "buckets": (1,), "shared": (3,), "shared_all_heads": 3},
                       3: {"ngrams": 3, "buckets": (1,), "shared": (3,), "shared_all_heads": 3}}
    wide = count_collisions(tokens, rows=1_000_003)
    assert wide[2] == wide[3] == {"ngrams": 3, "buckets": (3,), "shared": (0,), "shared_all_heads": 0}
    assert count_collisions(torch.tensor([4]), rows=5, orders=(2,))[2]["ngrams"] == 0


def test_count_collisions_match_a_dictionary_count():
    tokens = torch.randint(0, 6, (300,), generator=torch.Generator().manual_seed(0))
    report = count_collisions(tokens, rows=7, orders=(2, 3), heads=2, seed=5)
    ids = ngram_ids(tokens[None], rows=7, orders=(2, 3), heads=2, seed=5)[0].tolist()
    seq = tokens.tolist()
    for i, n in enumerate((2, 3)):
        buckets = {tuple(seq[t - n + 1:t + 1]): tuple(ids[t][2 * i:2 * i + 2]) for t in range(n - 1, len(seq))}
        per_head = [[b[k] for b in buckets.values()] for k in range(2)]
        both = list(buckets.values())
        assert report[n] == {"ngrams": len(buckets), "buckets": tuple(len(set(h)) for h in per_head),
                             "shared": tuple(sum(h.count(v) > 1 for v in h) for h in per_head),
                             "shared_all_heads": sum(both.count(v) > 1 for v in both)}


def test_hashed_ngram_forward_matches_loops():
    emb = HashedNgramEmbedding(20, hidden_size=6, num_layers=3, orders=(2, 3), heads=2, rows=31, dim=2, seed=4)
    assert {k: tuple(v.shape) for k, v in emb.state_dict().items()} == {
        "embed.weight": (31, 2), "proj.weight": (6, 8), "lambdas": (3,)}
    with torch.no_grad():
        emb.proj.weight.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(0))
        emb.lambdas.copy_(torch.tensor([0.1, -0.7, 2.0]))
    x = torch.randint(0, 20, (2, 5), generator=torch.Generator().manual_seed(1))
    y = emb(x)
    ids = _ref_ids(x, 31, (2, 3), 2, 4)
    E, W = emb.embed.weight.detach(), emb.proj.weight.detach()
    expected = torch.zeros(2, 5, 6)
    for b in range(2):
        for t in range(5):
            for s in range(4):
                for o in range(6):
                    for d in range(2):
                        expected[b, t, o] += float(W[o, s * 2 + d]) * float(E[int(ids[b, t, s]), d])
    torch.testing.assert_close(y, expected)
    torch.testing.assert_close(emb.layer_term(y, 1), -0.7 * expected)
    torch.testing.assert_close(emb(x, bucket_ids=ids), y)


def test_hashed_ngram_defaults():
    emb = HashedNgramEmbedding(10, hidden_size=8, num_layers=2)
    assert (emb.rows, emb.dim, emb.orders) == (53, 4, (2, 3))
    assert torch.equal(emb.lambdas.detach(), torch.full((2,), 0.1))


@pytest.mark.parametrize("sparse", [False, True])
def test_hashed_ngram_starts_at_zero_and_trains(sparse):
    emb = HashedNgramEmbedding(30, hidden_size=8, num_layers=2, orders=(2,), rows=37, sparse=sparse)
    x = torch.randint(0, 30, (2, 7), generator=torch.Generator().manual_seed(0))
    w = torch.randn(2, 7, 8, generator=torch.Generator().manual_seed(1))
    y = emb(x)
    assert torch.equal(emb.layer_term(y, 0), torch.zeros(2, 7, 8))
    (emb.layer_term(y, 0) * w).sum().backward()
    assert float(emb.proj.weight.grad.abs().sum()) > 0  # the zero projection moves first

    emb.zero_grad(set_to_none=True)
    emb.reset_parameters(torch.Generator().manual_seed(2), init="modded")
    assert torch.equal(emb.proj.weight.detach(), torch.eye(8))  # one order, one head, d = H: modded-nanogpt's form
    y = emb(x)
    assert torch.equal(y, torch.zeros_like(y))
    (emb.layer_term(y, 1) * w).sum().backward()
    grad, looked_up = emb.embed.weight.grad, set(emb.ngram_ids(x).flatten().tolist())
    assert grad.is_sparse == sparse
    dense = grad.to_dense() if sparse else grad
    assert {int(r) for r in dense.abs().sum(1).nonzero()} == looked_up
    if sparse:
        assert set(grad.coalesce().indices()[0].tolist()) == looked_up


def test_hashed_ngram_accounting():
    shape = dict(vocab_size=10, hidden_size=8, num_layers=3, orders=(2, 3), heads=2, rows=17, dim=3)
    # table 17·3 = 51, projection 8 · (2·2·3) = 96, scales 3: 150; FLOPs 2 · 8 · 12 = 192
    assert ngram.added_params(**shape) == 150
    assert ngram.flops_per_token(**shape) == 192
    assert sum(p.numel() for p in HashedNgramEmbedding(**shape).parameters()) == 150
    default = dict(vocab_size=40, hidden_size=12, num_layers=4)
    assert ngram.added_params(**default) == sum(p.numel() for p in HashedNgramEmbedding(**default).parameters())


def test_hashed_ngram_refuses_bad_arguments():
    x = torch.zeros(1, 4, dtype=torch.int64)
    for orders in ((1, 2), (2, 2), ()):
        with pytest.raises(ValueError, match="distinct integers >= 2"):
            ngram_ids(x, rows=11, orders=orders)
    with pytest.raises(ValueError, match="heads >= 1 and rows >= 1"):
        ngram_ids(x, rows=11, heads=0)
    with pytest.raises(ValueError, match="heads >= 1 and rows >= 1"):
        ngram_ids(x, rows=0)
    with pytest.raises(ValueError, match=r"input_ids \[B,T\]"):
        ngram_ids(x[0], rows=11)
    with pytest.raises(ValueError, match="1-D sample"):
        count_collisions(x, rows=11)
    emb = HashedNgramEmbedding(10, 8, 2, rows=11)
    with pytest.raises(ValueError, match="layer 2 is outside the model's 2 layers"):
        emb.layer_term(torch.zeros(1, 4, 8), 2)
    with pytest.raises(ValueError, match="unknown HashedNgramEmbedding init"):
        emb.reset_parameters(init="gemma")
    with pytest.raises(ValueError, match=r"bucket_ids must be \[B,T,2\]"):
        emb(x, bucket_ids=torch.zeros(1, 4, 3, dtype=torch.int64))


# ---------------------------------------------------------------------------------------------- token modulation


def test_token_modulation_matches_indexing():
    mod = TokenModulation(6, hidden_size=4, num_layers=3)
    assert {k: tuple(v.shape) for k, v in mod.state_dict().items()} == {"embed.weight": (6, 12)}
    mod.reset_parameters(torch.Generator().manual_seed(0), std=1.0, init="normal")
    ids = torch.tensor([[5, 0, 2], [1, 1, 4]])
    m = mod(ids).detach()
    h = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(1))
    outs = [TokenModulation.modulate(h, m[:, :, layer]) for layer in range(3)]
    T = mod.embed.weight.detach()
    for b in range(2):
        for t in range(3):
            for layer in range(3):
                for c in range(4):
                    want = float(T[int(ids[b, t]), layer * 4 + c])
                    assert float(m[b, t, layer, c]) == want
                    assert math.isclose(float(outs[layer][b, t, c]), float(h[b, t, c]) * (1.0 + want), rel_tol=1e-6)


@pytest.mark.parametrize("sparse", [False, True])
def test_token_modulation_starts_as_identity_and_trains(sparse):
    mod = TokenModulation(8, hidden_size=4, num_layers=2, sparse=sparse)
    ids = torch.tensor([[3, 3, 7], [0, 5, 3]])
    h = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    out = mod.modulate(h, mod(ids)[:, :, 1])
    assert out.dtype == torch.bfloat16 and torch.equal(out, h)
    out.float().sum().backward()
    grad = mod.embed.weight.grad
    assert grad.is_sparse == sparse
    dense = grad.to_dense() if sparse else grad
    assert {int(r) for r in dense.abs().sum(1).nonzero()} == {0, 3, 5, 7}
    assert float(dense[:, :4].abs().sum()) == 0.0  # layer 0's columns were not used


def test_token_modulation_accounting_and_module_apply():
    # V·L·H = 10·3·8 = 240 parameters, no matmul
    assert modulation.added_params(10, 8, 3) == 240 == sum(p.numel() for p in TokenModulation(10, 8, 3).parameters())
    assert modulation.flops_per_token(10, 8, 3) == 0
    seen = []
    nn.Sequential(TokenModulation(10, 8, 3)).apply(lambda module: seen.append(type(module).__name__))
    assert "TokenModulation" in seen  # nn.Module.apply still walks into it


def test_token_modulation_on_a_subset_of_layers():
    """``layers`` sizes the table by V·H per modulated layer; the others get no modulation (None), and the table's
    s-th block serves the s-th selected layer."""
    mod = TokenModulation(10, 4, 3, layers=[2, 0])
    assert mod.layers == (0, 2) and tuple(mod.embed.weight.shape) == (10, 8)
    assert modulation.added_params(10, 4, 3, [2, 0]) == 80 == sum(p.numel() for p in mod.parameters())
    mod.reset_parameters(torch.Generator().manual_seed(0), std=1.0, init="normal")
    ids = torch.tensor([[1, 9]])
    m = mod(ids)
    assert m.shape == (1, 2, 2, 4) and mod.at(m, 1) is None
    T = mod.embed.weight.detach()
    assert torch.equal(mod.at(m, 0)[0, 1], T[9, :4]) and torch.equal(mod.at(m, 2)[0, 0], T[1, 4:])
    assert modulation.added_params(10, 4, 3) == 120 and TokenModulation(10, 4, 3).layers == (0, 1, 2)
    with pytest.raises(ValueError, match="distinct layer indices"):
        TokenModulation(10, 4, 3, layers=[3])


def test_token_modulation_refuses_bad_arguments():
    mod = TokenModulation(10, 8, 3)
    with pytest.raises(ValueError, match=r"ids \[B,T\]"):
        mod(torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="one shape"):
        mod.modulate(torch.zeros(1, 2, 8), torch.zeros(1, 2, 4))
    with pytest.raises(ValueError, match="unknown TokenModulation init"):
        mod.reset_parameters(init="gemma")
    with pytest.raises(ValueError, match=">= 1"):
        TokenModulation(10, 0, 3)
