"""Everything a visual run reads, prepared once: scenes (or users' pairs), the caption vocabulary,
frozen-encoder patch features, the visual IDs of the run's method, and the ID metrics.

Train and validation scenes are separate draws (``data_seed`` and a derived seed); users' pairs are
split 90/10 by position. For ``ids=random`` the training IDs are drawn afresh for every occurrence
(:meth:`VisualData.train_ids`), from dct-kmeans's ID frequencies; validation uses one fixed draw.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from plelab.config.schema import QUANTIZER_IDS, RunConfig
from plelab.errors import PlelabError
from plelab.visual.encoder import EncoderConfig, encode_with, get_encoder
from plelab.visual.ids import DCTKMeans, FeatureKMeans, OracleIDs, RandomIDs
from plelab.visual.loader import load_image_captions, split_pairs
from plelab.visual.metrics import id_report
from plelab.visual.online import patch_pixels, pretrained_frozen
from plelab.visual.scenes import SceneSet, fingerprint, generate_scenes
from plelab.visual.text import PAD, WordVocab

VAL_SEED_OFFSET = 1_000_003
NOISE_SEED_OFFSET = 2_000_029  # visual.feature_noise: the draws' seeds (train; validation + 1)


@dataclass
class VisualData:
    vocab: WordVocab
    train_feats: torch.Tensor  # [N, P, D]
    val_feats: torch.Tensor
    train_caps: torch.Tensor  # [N, T] word ids
    val_caps: torch.Tensor
    val_content: torch.Tensor  # [N, T] bool: content-word positions
    train_ids: torch.Tensor | None  # [N, P] visual IDs (None: no visual table)
    val_ids: torch.Tensor | None
    corpus_fingerprint: str
    id_metrics: dict = field(default_factory=dict)
    random_probs: torch.Tensor | None = None  # ids=random: the frequencies every occurrence is drawn from
    val_labels: np.ndarray | None = None  # [N, P] ground-truth patch labels of the validation scenes (NMI)
    train_pixels: torch.Tensor | None = None  # ids=vq/lfq/bsq: [N, P, patch²·3] reconstruction targets
    quantizer: object | None = None  # ids=vq/lfq/bsq with visual.online=false: the pretrained, frozen quantizer
    # the features the LM reads: ``train_feats`` / ``val_feats`` themselves unless visual.feature_noise > 0
    lm_train_feats: torch.Tensor | None = None
    lm_val_feats: torch.Tensor | None = None

    def __post_init__(self):
        self.lm_train_feats = self.train_feats if self.lm_train_feats is None else self.lm_train_feats
        self.lm_val_feats = self.val_feats if self.lm_val_feats is None else self.lm_val_feats

    @property
    def num_patches(self) -> int:
        return self.train_feats.shape[1]

    @property
    def feature_dim(self) -> int:
        return self.train_feats.shape[2]

    def batch_ids(self, index: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor | None:
        """Visual IDs of training scenes ``index`` (fresh i.i.d. draws for the random control)."""
        if self.random_probs is not None:
            n = len(index) * self.num_patches
            return torch.multinomial(self.random_probs, n, replacement=True, generator=generator).view(len(index), -1)
        return None if self.train_ids is None else self.train_ids[index]

    def unigram_entropy(self, vocab_size: int) -> float:
        """Entropy (nats) of the validation captions' word distribution: a context-free model's loss."""
        tokens = self.val_caps[self.val_caps != PAD].numpy()
        p = np.bincount(tokens, minlength=vocab_size).astype(np.float64)
        p = p[p > 0] / p.sum()
        return float(-(p * np.log(p)).sum())


def _scenes(cfg: RunConfig) -> tuple[SceneSet, SceneSet]:
    v = cfg.visual
    if v.data is None:
        return (generate_scenes(v.scenes, v.data_seed, v.image_size, v.patch),
                generate_scenes(v.val_scenes, v.data_seed + VAL_SEED_OFFSET, v.image_size, v.patch))
    pairs = load_image_captions(v.data, v.image_size, v.patch)
    if len(pairs) < 20:
        raise PlelabError(f"{v.data} has {len(pairs)} image–caption pairs; a visual run needs at least 20")
    return split_pairs(pairs)


def _encoder(cfg: RunConfig, train: SceneSet, log=None):
    v = cfg.visual
    return get_encoder(train, EncoderConfig(image_size=v.image_size, patch=v.patch), steps=v.encoder_steps,
                       seed=v.data_seed, log=log)


def warm_encoder(cfg: RunConfig) -> None:
    """Pretrain (or find in the cache) the encoder a visual run will use."""
    _encoder(cfg, _scenes(cfg)[0])


def prepare_visual(cfg: RunConfig, log=None) -> VisualData:
    """Scenes → vocabulary → encoder features → visual IDs (``cfg.visual``) → :class:`VisualData`."""
    v = cfg.visual
    train, val = _scenes(cfg)
    vocab = WordVocab.build(train.captions)
    length = min(v.caption_len, max(len(c.split()) for c in train.captions) + 1)
    train_caps, _ = vocab.encode(train.captions, length)
    val_caps, val_content = vocab.encode(val.captions, length)
    vit = _encoder(cfg, train, log)
    encode = lambda images: encode_with(vit, images)  # noqa: E731
    train_feats, val_feats = encode(train.images), encode(val.images)
    method, random_probs, metrics = None, None, {}
    if v.ids == "dct-kmeans" or v.ids == "random":
        method = DCTKMeans(v.k).fit(train, v.data_seed)
    elif v.ids == "siglip-kmeans":
        method = FeatureKMeans(v.k, encode).fit(train, v.data_seed)
    elif v.ids == "oracle":
        method = OracleIDs(v.k).fit(train)
    train_ids = val_ids = train_pixels = quantizer = None
    val_labels = val.semantic_labels() if val.has_labels else None
    if v.ids in QUANTIZER_IDS:
        train_pixels = patch_pixels(train.images, v.patch)
        if not v.online:
            quantizer = pretrained_frozen(cfg, train_feats, train_pixels)
            train_ids = quantizer.assign(train_feats.flatten(0, 1)).view(train_feats.shape[:2])
            val_ids = quantizer.assign(val_feats.flatten(0, 1)).view(val_feats.shape[:2])
            metrics = id_report(val_ids, v.k, val_labels)
    if method is not None:
        train_ids, val_ids = method.assign(train), method.assign(val)
        if v.ids == "random":
            rnd = RandomIDs(method).fit(train)
            random_probs, val_ids = rnd.probs, rnd.assign(val, seed=v.data_seed)
        metrics = id_report(val_ids, v.k, val_labels)
    ids_key = f"{v.ids}:{v.k}" + (f":{v.online}:{v.quantizer_lr}:{v.quantizer_batch}" if v.ids in QUANTIZER_IDS else "")
    ids_key += f":{cfg.train.steps}" if quantizer is not None else ""  # the frozen quantizer depends on it
    noise_key = f":noise{v.feature_noise!r}" if v.feature_noise else ""  # keys without noise stay as they were
    key = hashlib.sha256(f"{fingerprint(train)}:{fingerprint(val)}:{ids_key}:{v.encoder_steps}:{length}:"
                         f"{v.features}{noise_key}".encode())
    lm_train, lm_val = noisy_views(train_feats, val_feats, v.feature_noise, v.data_seed)
    return VisualData(vocab, train_feats, val_feats, torch.from_numpy(train_caps), torch.from_numpy(val_caps),
                      torch.from_numpy(val_content), train_ids, val_ids, key.hexdigest(), metrics, random_probs,
                      val_labels, train_pixels, quantizer, lm_train, lm_val)


def noisy_views(train: torch.Tensor, val: torch.Tensor, noise: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The LM's view of the patch features ``[N, P, D]``: each feature plus Gaussian noise of sd ``noise`` × its
    training-set sd, one fixed draw per scene (seeded by ``seed``), so the image tells the LM less than it tells the
    tokenizers. ``noise = 0``: the features themselves."""
    if not noise:
        return train, val
    sd = train.flatten(0, 1).std(dim=0) * noise  # [D]
    views = []
    for offset, feats in ((0, train), (1, val)):
        gen = torch.Generator().manual_seed(seed + NOISE_SEED_OFFSET + offset)
        views.append(feats + torch.randn(feats.shape, generator=gen, dtype=feats.dtype) * sd)
    return views[0], views[1]


def caption_losses(per_token: torch.Tensor, caps: torch.Tensor, content: torch.Tensor) -> dict:
    """Mean caption loss overall, on content words and on template words (``<eos>`` counts as template)."""
    real = caps != PAD
    out = {}
    for name, mask in (("caption", real), ("content", real & content), ("template", real & ~content)):
        n = int(mask.sum())
        out[name] = float(per_token[mask].sum() / n) if n else math.nan
    return out
