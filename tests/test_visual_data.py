"""Visual PLE part 1 foundations: scenes, users' image–caption data, offline visual IDs, ID metrics."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from plelab.errors import PlelabError
from plelab.visual.ids import DCTKMeans, FeatureKMeans, OracleIDs, RandomIDs, zigzag
from plelab.visual.kmeans import kmeans
from plelab.visual.loader import load_image_captions
from plelab.visual.metrics import id_report, nmi, perplexity, utilisation
from plelab.visual.scenes import CONTENT_WORDS, COUNT_WORDS, generate_scenes


@pytest.fixture(scope="module")
def scenes():
    return generate_scenes(600, seed=0), generate_scenes(200, seed=1)


def test_scenes_are_deterministic_and_labelled(scenes):
    train, _ = scenes
    again = generate_scenes(600, seed=0)
    assert np.array_equal(train.images, again.images) and train.captions == again.captions
    assert np.array_equal(train.patch_object, again.patch_object)
    assert not np.array_equal(generate_scenes(5, seed=9).images, train.images[:5])
    assert train.images.shape == (600, 48, 48, 3) and train.patch_colour.shape == (600, 36)
    for i in range(len(train)):
        words = train.captions[i].split()
        n = COUNT_WORDS.index(words[0]) + 1
        assert train.captions[i].count(" a ") == n
        assert set(np.unique(train.patch_object[i])) - {0} == set(range(1, n + 1))  # every object owns a patch
        assert {w for w in words if w in CONTENT_WORDS} >= {words[0]}
    # a patch's colour label is the colour of the object the generator drew there
    img, colour = train.images[0], train.patch_colour[0]
    fg = np.nonzero(colour)[0][0]
    g = 48 // 8
    block = img[(fg // g) * 8:(fg // g + 1) * 8, (fg % g) * 8:(fg % g + 1) * 8].reshape(-1, 3)
    assert block.max(axis=0).max() > 100 and train.semantic_labels().max() < OracleIDs.NEEDED


def _png(path, colour=(200, 10, 10)):
    from PIL import Image

    Image.new("RGB", (20, 30), colour).save(path)


def test_loader_reads_jsonl_and_folders(tmp_path):
    _png(tmp_path / "a.png")
    _png(tmp_path / "b.png", (0, 0, 250))
    (tmp_path / "data.jsonl").write_text(json.dumps({"image": "a.png", "caption": "a red box"}) + "\n\n"
                                         + json.dumps({"image": "b.png", "caption": "a blue box"}) + "\n")
    ds = load_image_captions(tmp_path / "data.jsonl", image_size=16, patch=8)
    assert ds.images.shape == (2, 16, 16, 3) and ds.captions == ["a red box", "a blue box"] and not ds.has_labels
    assert ds.images[0, 8, 8, 0] > 150 and ds.images[1, 8, 8, 2] > 150
    folder = tmp_path / "f"
    folder.mkdir()
    _png(folder / "x.png")
    (folder / "x.txt").write_text("a red box\n")
    assert load_image_captions(folder, image_size=16, patch=8).captions == ["a red box"]


def test_loader_errors_are_one_line(tmp_path):
    _png(tmp_path / "ok.png")
    (tmp_path / "bad.png").write_bytes(b"not an image at all")
    cases = {
        "missing.jsonl": (None, "does not exist"),
        "m.jsonl": (json.dumps({"image": "nope.png", "caption": "x"}), "does not exist"),
        "c.jsonl": (json.dumps({"image": "bad.png", "caption": "x"}), "is not a readable image"),
        "j.jsonl": ("{not json", "is not valid JSON"),
        "f.jsonl": (json.dumps({"image": "ok.png"}), "needs string fields"),
        "e.jsonl": (json.dumps({"image": "ok.png", "caption": "  "}), "is empty"),
        "z.jsonl": ("\n", "no image–caption pairs"),
    }
    for name, (text, needle) in cases.items():
        if text is not None:
            (tmp_path / name).write_text(text + "\n")
        with pytest.raises(PlelabError, match=needle) as err:
            load_image_captions(tmp_path / name, image_size=16, patch=8)
        assert "\n" not in str(err.value)
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    _png(lonely / "y.png")
    with pytest.raises(PlelabError, match="has no caption file"):
        load_image_captions(lonely)
    assert (tmp_path / "ok.png").exists() and (tmp_path / "bad.png").read_bytes() == b"not an image at all"


def test_kmeans_recovers_separated_clusters_and_is_deterministic():
    gen = torch.Generator().manual_seed(0)
    centres = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    x = torch.cat([c + 0.3 * torch.randn(200, 2, generator=gen) for c in centres])
    c, inertia = kmeans(x, 3, seed=1)
    assert torch.cdist(c, centres).min(dim=0).values.max() < 0.2 and inertia < 0.3
    assert torch.equal(kmeans(x, 3, seed=1)[0], c)
    c4, _ = kmeans(torch.cat([x, x[:1].repeat(50, 1)]), 4, seed=0)  # duplicates: no empty or NaN cluster
    assert torch.isfinite(c4).all()
    cs, _ = kmeans(x + 0.01, 3, seed=0, spherical=True)
    assert torch.allclose(cs.norm(dim=1), torch.ones(3))


def test_metrics_on_controlled_cases():
    a = np.repeat(np.arange(8), 50)
    assert nmi(a, a) == pytest.approx(1.0) and nmi(a, (a + 3) % 8) == pytest.approx(1.0)  # relabelling
    rng = np.random.default_rng(0)
    assert nmi(rng.integers(0, 8, 100_000), rng.integers(0, 8, 100_000)) < 0.001
    assert nmi(a, a // 2) == pytest.approx(2 * np.log(4) / (np.log(8) + np.log(4)))  # H(B)=I, mean entropy
    u = utilisation(np.array([0, 1, 1, 3]), 8)
    assert u["utilisation"] == 3 / 8 and u["uniform_baseline"] == pytest.approx(1 - (7 / 8) ** 4)
    assert perplexity(np.arange(16), 16)["perplexity"] == pytest.approx(16)
    assert perplexity(np.zeros(10, dtype=int), 16)["perplexity"] == pytest.approx(1)


def test_id_stability_against_chance():
    from plelab.visual.flips import flip_stats

    def id_stability(a, b, k):  # the three numbers the report's ID-flips column shows
        out = flip_stats(a, b, k)
        return {key: out[key] for key in ("flip_rate", "chance", "patches")}

    a = torch.tensor([0, 1, 2, 3] * 25)
    assert id_stability(a, a, 4) == {"flip_rate": 0.0, "chance": 0.75, "patches": 100}
    b = a.clone()
    b[:10] = (b[:10] + 1) % 4  # 10 known flips, frequencies unchanged
    out = id_stability(a, b, 4)
    assert out["flip_rate"] == 0.1 and abs(out["chance"] - 0.75) < 1e-12
    assert id_stability(torch.zeros(50, dtype=torch.long), torch.zeros(50, dtype=torch.long), 8)["chance"] == 0.0


def test_visual_diagnostic_helpers():
    from plelab.visual.diagnostics import gradient_per_row, paired_change

    base = torch.tensor([[1.0, 1.0, 0.0], [2.0, 2.0, 2.0]])
    new = torch.tensor([[2.0, 1.0, 5.0], [2.0, 3.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # the masked-out 5.0 must not count
    out = paired_change(base, new, mask)
    assert out["captions"] == 2 and abs(out["delta"] - (0.5 + 1 / 3) / 2) < 1e-6
    w = torch.nn.Parameter(torch.zeros(5, 2 * 3))
    w.grad = torch.zeros(5, 6)
    w.grad[1, :3], w.grad[3, 3:] = 3.0, 4.0  # row 1 gets a layer-0 gradient, row 3 a layer-1 gradient
    assert gradient_per_row(w, 2, 3) == pytest.approx([3 ** 0.5 * 3 / 2, 3 ** 0.5 * 4 / 2])


def test_offline_ids_and_controls(scenes, tmp_path):
    train, val = scenes
    labels = val.semantic_labels()
    dct = DCTKMeans(64).fit(train, seed=0)
    ids = dct.assign(val)
    assert ids.shape == (200, 36) and ids.dtype == torch.int64 and int(ids.max()) < 64
    assert torch.equal(DCTKMeans(64).fit(train, seed=0).assign(val), ids)  # deterministic
    rep = id_report(ids, 64, labels)
    rnd = RandomIDs(dct).fit(train)
    rnd_ids = rnd.assign(val, seed=5)
    assert not torch.equal(rnd_ids, rnd.assign(val, seed=6)) and torch.equal(rnd_ids, rnd.assign(val, seed=5))
    oracle = OracleIDs(64).fit(train).assign(val)
    assert id_report(oracle, 64, labels)["nmi"] == pytest.approx(1.0)
    assert rep["nmi"] > 0.3 and rep["nmi"] > 5 * id_report(rnd_ids, 64, labels)["nmi"]
    assert list(zigzag(3)) == [0, 1, 3, 6, 4, 2, 5, 7, 8]
    path = dct.save(tmp_path / "dct.safetensors")
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        assert json.loads(f.metadata()["plelab"])["method"] == "dct-kmeans" and "centroids" in f.keys()
    with pytest.raises(PlelabError, match="needs patch labels"):
        OracleIDs(64).assign(load_like_user_data(val))


def load_like_user_data(s):
    from plelab.visual.scenes import SceneSet

    return SceneSet(s.images, s.captions, s.patch)


def test_feature_kmeans_on_an_encoder_that_sees_colour(scenes):
    train, val = scenes

    def encode(images: np.ndarray) -> torch.Tensor:  # mean colour of each patch, plus a constant
        from plelab.visual.ids import patches

        p = torch.from_numpy(patches(images.astype(np.float32) / 255, 8)).mean(dim=(2, 3))
        return torch.cat([p, torch.full_like(p[..., :1], 0.1)], dim=-1)

    fk = FeatureKMeans(32, encode, encoder_name="mean-colour").fit(train, seed=0)
    ids = fk.assign(val)
    # the IDs follow what the encoder sees (colour) far more than what it does not (shape)
    assert nmi(ids, val.patch_colour) > 0.4 > nmi(ids, val.patch_shape)
    assert torch.equal(FeatureKMeans(32, encode).fit(train, seed=0).assign(val), ids)
    with pytest.raises(PlelabError, match="one per patch"):
        FeatureKMeans(8, lambda im: torch.zeros(len(im), 3, 4)).fit(train)


@pytest.mark.slow
def test_visual_ids_command(tmp_path, capsys):
    from plelab.cli import main

    assert main(["visual-ids", "--scenes", "300", "--k", "48", "--out", str(tmp_path / "ids")]) == 0
    out = capsys.readouterr().out
    assert "dct-kmeans" in out and "oracle" in out and "1.000" in out
    assert "siglip-kmeans" in out
    assert {p.name for p in (tmp_path / "ids").iterdir()} == {"dct-kmeans.safetensors", "siglip-kmeans.safetensors",
                                                             "random.safetensors"}
    folder = tmp_path / "mine"
    folder.mkdir()
    for i in range(12):
        _png(folder / f"{i}.png", (20 * i, 100, 200 - 10 * i))
        (folder / f"{i}.txt").write_text(f"picture {i}")
    assert main(["visual-ids", "--data", str(folder), "--k", "4", "--image-size", "16"]) == 0
    assert "no labels" in capsys.readouterr().out
    assert main(["visual-ids", "--k", "1"]) == 2


def test_siglip_loss_formula_and_pretraining(scenes, tmp_path):
    from plelab.visual.encoder import (
        EncoderConfig,
        encode_with,
        get_encoder,
        load_encoder,
        pretrain_encoder,
        save_encoder,
        siglip_loss,
    )

    x = torch.nn.functional.normalize(torch.randn(4, 8, generator=torch.Generator().manual_seed(0)), dim=1)
    y = torch.nn.functional.normalize(torch.randn(4, 8, generator=torch.Generator().manual_seed(1)), dim=1)
    t, b = torch.tensor(np.log(10.0)), torch.tensor(-10.0)
    manual = -sum(np.log(1 / (1 + np.exp(-(1 if i == j else -1) * (10 * float(x[i] @ y[j]) - 10))))
                  for i in range(4) for j in range(4)) / 4
    assert float(siglip_loss(x, y, t, b)) == pytest.approx(manual, rel=1e-5)
    train, val = scenes
    cfg = EncoderConfig(dim=32, layers=1, heads=2, embed_dim=32)
    vit, losses = pretrain_encoder(train, cfg, steps=40, batch=32)
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 1.0  # it learns to match images and captions
    feats = encode_with(vit, val.images[:10])
    assert feats.shape == (10, 36, 32) and not any(p.requires_grad for p in vit.parameters())
    again = load_encoder(save_encoder(vit, tmp_path / "enc.safetensors"))
    assert torch.equal(encode_with(again, val.images[:10]), feats)
    first = get_encoder(train, cfg, steps=20)
    cache = Path(os.environ["PLELAB_CACHE"]) / "encoders"
    cached = sorted((p.name, p.stat().st_mtime_ns) for p in cache.glob("tinyvit-*"))
    assert cached
    assert torch.equal(encode_with(get_encoder(train, cfg, steps=20), val.images[:4]),
                       encode_with(first, val.images[:4]))
    assert cached == sorted((p.name, p.stat().st_mtime_ns) for p in cache.glob("tinyvit-*"))  # no retraining
    (tmp_path / "junk.safetensors").write_bytes(b"junk")
    with pytest.raises(PlelabError, match="not a plelab encoder"):
        load_encoder(tmp_path / "junk.safetensors")


def test_hf_siglip_vision_tower_from_a_local_folder(scenes, tmp_path):
    transformers = pytest.importorskip("transformers")
    from plelab.visual.encoder import HFSiglipEncoder, to_pixels

    cfg = transformers.SiglipVisionConfig(image_size=48, patch_size=8, hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=1, num_attention_heads=2)
    torch.manual_seed(0)
    transformers.SiglipVisionModel(cfg).save_pretrained(tmp_path / "siglip")
    enc = HFSiglipEncoder(tmp_path / "siglip")
    _, val = scenes
    feats = enc(to_pixels(val.images[:6]))
    assert feats.shape == (6, 36, 32)
    fk = FeatureKMeans(8, lambda im: enc(to_pixels(im)).detach(), encoder_name="siglip").fit(val, seed=0)
    assert fk.assign(val).shape == (200, 36)
    with pytest.raises(PlelabError, match="does not exist"):
        HFSiglipEncoder(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PlelabError, match="holds no model.safetensors weights, so it cannot be loaded as a SigLIP"):
        HFSiglipEncoder(tmp_path / "empty")
