"""The multimodal PLE model: image prefix + caption, text PLE on text positions, visual table at
image positions (no padding row), caption-only loss, pairing with text-only runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from plelab.config import resolve_config
from plelab.model.init import build_model
from plelab.visual.model import build_visual_model
from plelab.visual.scenes import CONTENT_WORDS, generate_scenes
from plelab.visual.text import EOS, PAD, WordVocab


@pytest.fixture(scope="module")
def batch():
    scenes = generate_scenes(6, seed=0)
    vocab = WordVocab.build(scenes.captions)
    caps, content = vocab.encode(scenes.captions, 40)
    gen = torch.Generator().manual_seed(0)
    feats = torch.randn(6, scenes.num_patches, 24, generator=gen)
    ids = torch.randint(0, 16, (6, scenes.num_patches), generator=gen)
    return vocab, torch.from_numpy(caps), torch.from_numpy(content), feats, ids


def _cfg(vocab, dp=8):
    return resolve_config("cpu-tiny", [f"model.vocab_size={len(vocab)}"], dp=dp)


def test_word_vocab_and_content_mask():
    vocab = WordVocab.build(["two objects : a small red circle", "one object : a large blue square"])
    ids, content = vocab.encode(["a small red circle", "a purple thing"], 6)
    assert vocab.decode(ids[0]) == "a small red circle" and ids[0, 4] == EOS and ids[0, 5] == PAD
    assert content[0].tolist() == [False, True, True, True, False, False]
    assert ids[1, 1] == 2 and ids[1, 2] == 2  # <unk> for unseen words
    assert {"red", "circle", "small", "two", "left"} <= CONTENT_WORDS and "a" not in CONTENT_WORDS


def test_forward_shapes_and_caption_only_loss(batch):
    vocab, caps, content, feats, ids = batch
    cfg = _cfg(vocab)
    model = build_visual_model(cfg.model, cfg.ple, feature_dim=24, num_patches=36, num_ids=16, seed=0)
    loss = model(feats, ids, caps)
    assert loss.shape == caps.shape and torch.all(loss[caps == PAD] == 0) and torch.all(loss[caps != PAD] > 0)
    # causal: changing a later caption token leaves the loss of earlier tokens unchanged
    later = caps.clone()
    later[:, 10] = 3
    assert torch.allclose(model(feats, ids, later)[:, :10], loss[:, :10])
    # the image is used: other features change the caption loss; drop_image makes it independent of them
    assert not torch.allclose(model(feats * 3, ids, caps), loss)
    assert torch.allclose(model(feats, ids, caps, drop_image=True), model(feats * 3, ids * 0, caps, drop_image=True))


def test_token_part_text_and_visual_positions(batch):
    vocab, caps, _, feats, ids = batch
    cfg = _cfg(vocab)
    model = build_visual_model(cfg.model, cfg.ple, 24, 36, 16, seed=0)
    _, h, z = model.sequence(feats, ids, caps)
    L, dP = cfg.model.num_hidden_layers, cfg.ple.dim
    assert h.shape == (6, 36 + 40, cfg.model.hidden_size) and z.shape == (6, 76, L, dP)
    assert torch.equal(z[:, 36:], model.lm.model.per_layer_token_embeddings(caps))
    expected = model.visual_embed_tokens_per_layer.weight[ids] * dP ** 0.5
    assert torch.allclose(z[:, :36], expected.view(6, 36, L, dP))
    # every visual ID is trainable, row 0 included (no padding row); unused rows get no gradient
    model(feats, torch.zeros_like(ids), caps).sum().backward()
    grad = model.visual_embed_tokens_per_layer.weight.grad
    assert grad[0].abs().sum() > 0 and grad[1:].abs().sum() == 0


def test_baseline_has_no_visual_table_and_pairs_with_text_runs(batch):
    vocab, caps, _, feats, ids = batch
    cfg = _cfg(vocab)
    base = build_visual_model(cfg.model, cfg.ple, 24, 36, num_ids=0, seed=3)
    assert not hasattr(base, "visual_embed_tokens_per_layer")
    _, _, z = base.sequence(feats, ids, caps)
    assert torch.all(z[:, :36] == 0)
    with_table = build_visual_model(cfg.model, cfg.ple, 24, 36, num_ids=16, seed=3)
    text_only = build_model(cfg.model, cfg.ple, seed=3)
    for name, p in text_only.named_parameters():  # the LM (trunk and text table) is identical across arms
        assert torch.equal(p, dict(with_table.lm.named_parameters())[name])
        assert torch.equal(p, dict(base.lm.named_parameters())[name])
    assert torch.equal(base.projector.weight, with_table.projector.weight)
    no_ple = _cfg(vocab, dp=0)
    plain = build_visual_model(no_ple.model, no_ple.ple, 24, 36, num_ids=16, seed=0)
    assert plain.num_ids == 0 and plain(feats, ids, caps).shape == caps.shape
    assert np.isfinite(plain(feats, None, caps).sum().item())
