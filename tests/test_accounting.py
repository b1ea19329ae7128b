import itertools

import pytest

from plelab.config import PRESETS, get_preset, resolve_config
from plelab.model import build_model
from plelab.model.accounting import (
    GROUPS,
    account,
    closed_form_counts,
    counts_from_model,
    flops_per_token,
    accounting_groups,
)

# The seed's table (seed 000), exact integers (docs/ple.md §2.2).
SEED_ADDED = {64: 220_807_232, 128: 441_532_544, 256: 882_983_168, 512: 1_765_884_416}
SEED_PCT = {64: "8.98", 128: "17.96", 256: "35.92", 512: "71.83"}


def test_seed_3b_base_and_added_parameters_are_exact():
    for dp, added in SEED_ADDED.items():
        cfg = resolve_config("seed-3b", dp=dp)
        a = account(cfg.model, cfg.ple, cfg.train.seq_len)
        assert a.base == 2_458_421_760
        assert a.added == added
        assert f"{a.added_pct:.2f}" == SEED_PCT[dp]


def test_seed_3b_dp256_breakdown():
    cfg = resolve_config("seed-3b", dp=256)
    g = account(cfg.model, cfg.ple, cfg.train.seq_len).groups
    assert (g["ple_table"], g["ple_model_projection"], g["ple_per_layer"]) == (819_986_432, 20_971_776, 42_024_960)


@pytest.mark.parametrize("preset, table, total", [
    ("gemma3n-e2b", 2_013_265_920, 2_060_513_536),
    ("gemma3n-e4b", 2_348_810_240, 2_403_932_416),
])
def test_gemma3n_ple_sizes(preset, table, total):
    cfg = get_preset(preset)
    a = account(cfg.model, cfg.ple, cfg.train.seq_len)
    assert a.groups["ple_table"] == table and a.added == total


@pytest.mark.slow
@pytest.mark.parametrize("preset, gate, tied", itertools.product(list(PRESETS), ["gemma", "scalar", "vector", "none"],
                                                                 [True, False]))
def test_model_counts_equal_closed_form(preset, gate, tied):
    cfg = resolve_config(preset, [f"model.tie_word_embeddings={tied}"], gate=gate)
    model = build_model(cfg.model, cfg.ple, device="meta")
    assert counts_from_model(model) == closed_form_counts(cfg.model, cfg.ple)
    account(cfg.model, cfg.ple, cfg.train.seq_len)  # also cross-checks matmul params


def test_param_groups_partition_the_model(tiny_cfg):
    model = build_model(tiny_cfg.model, tiny_cfg.ple, device="meta")
    groups = accounting_groups(model)
    assert list(groups) == list(GROUPS)
    names = [n for members in groups.values() for n, _ in members]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())
    assert [n for n, _ in groups["ple_table"]] == ["model.embed_tokens_per_layer.weight"]


def test_flops_per_token_by_hand():
    cfg = resolve_config("cpu-tiny", dp=0)
    m = cfg.model
    H, L, V, F, T = m.hidden_size, m.num_hidden_layers, m.vocab_size, m.intermediate_size, cfg.train.seq_len
    attn_w = L * (2 * H * H + 2 * H * (H // 2))  # 4 query heads, 2 KV heads of head_dim 16
    matmul = attn_w + L * 3 * H * F + V * H
    assert flops_per_token(m, cfg.ple, T) == 6 * matmul + 12 * L * H * T
    with_ple = resolve_config("cpu-tiny", dp=16)
    extra = 6 * (H * L * 16 + L * 2 * H * 16)
    assert flops_per_token(with_ple.model, with_ple.ple, T) == 6 * matmul + 12 * L * H * T + extra
