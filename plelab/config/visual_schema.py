"""The visual section of a run config (:class:`VisualConfig`) and its choices, declared once as ``Literal`` types."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, get_args

from plelab.config.checks import _DATA, _require, _require_choice
from plelab.config.overrides import tags

QuantizerIds = Literal["vq", "lfq", "bsq"]
VisualIds = Literal["none", "dct-kmeans", "siglip-kmeans", "random", "oracle", QuantizerIds]
Injection = Literal["per-layer", "layer0"]
VISUAL_IDS: tuple[str, ...] = get_args(VisualIds)
QUANTIZER_IDS: tuple[str, ...] = get_args(QuantizerIds)


@dataclass
class VisualConfig:
    """Visual PLE runs: image–caption data, frozen patch encoder, visual IDs and the visual table.

    In a run of kind ``visual`` (``RunConfig.kind``) the run trains :class:`plelab.visual.model.VisualPLEModel` on image–caption pairs
    (the embedded scenes, or ``data``) with the caption loss; ``ids`` picks what keys the visual table
    (``none``: no visual table, the baseline; ``random``: i.i.d. draws from dct-kmeans's ID frequencies;
    ``oracle``: the scenes' patch labels; ``vq`` / ``lfq`` / ``bsq``: online quantizers of the patch
    features). ``model.vocab_size`` is set from the caption vocabulary.

    Quantizers train on their own stream of scenes (seeded by ``data_seed``, ``quantizer_batch`` images
    a step, Adam at ``quantizer_lr``), one step per LM step: with ``online`` the LM's IDs come from the
    quantizer as it trains (IDs flip); otherwise it is pretrained for ``train.steps`` steps on the same
    stream and frozen — it ends identical to the online one, so the two arms differ only by the flips.
    """

    ids: VisualIds = field(default="none", metadata=tags("sweep_data", "visual_ids"))
    k: int = field(default=64, metadata=tags("sweep_data", "visual_ids"))
    scenes: int = field(default=4000, metadata=_DATA)
    val_scenes: int = field(default=400, metadata=_DATA)
    data_seed: int = field(default=0, metadata=_DATA)
    image_size: int = field(default=48, metadata=_DATA)
    patch: int = field(default=8, metadata=_DATA)
    encoder_steps: int = field(default=300, metadata=_DATA)
    caption_len: int = field(default=48, metadata=_DATA)
    # False withholds the continuous patch features: image positions get one learned constant
    # embedding, so the image reaches the model only through the visual table (the redundancy ablation,
    # and the setting where the oracle control must win).
    features: bool = field(default=True, metadata=_DATA)
    # Noise added to the features the LM reads (not to what the tokenizers read), in units of each feature's
    # training-set sd, one fixed draw per scene: a caption task with room for a table keyed by good IDs to help
    # (with clean features the image alone leaves little to explain, and a study on it cannot fail).
    feature_noise: float = field(default=0.0, metadata=_DATA)
    # Users' image–caption pairs (.jsonl or a folder); None = the embedded scenes.
    data: str | None = field(default=None, metadata=tags("sweep_data", "path"))
    online: bool = field(default=True, metadata=tags("sweep_data", "quantizer_ids"))
    quantizer_lr: float = field(default=1e-3, metadata=tags("sweep_data", "quantizer_ids"))
    quantizer_batch: int = field(default=32, metadata=tags("sweep_data", "quantizer_ids"))
    # The visual next-token fix and the redundancy ablation (issue 8): ``table`` switches the visual
    # table keyed by the IDs on or off (the IDs may still be targets); ``injection`` is its form —
    # ``per-layer`` (the [K, L·dP] table through each layer's gate) or ``layer0`` (one [K, H] ID
    # embedding added to the image positions' input); ``loss_weight`` is λ in L = L_text + λ·L_visual,
    # L_visual the cross-entropy of a head over the K IDs predicting the next patch's ID (raster order).
    table: bool = True
    injection: Injection = "per-layer"
    loss_weight: float = 0.0

    def validate(self) -> None:
        _require_choice(self.ids, "visual.ids", VisualIds)
        _require(self.k >= 2, "visual.k", self.k, "an integer >= 2")
        _require(self.scenes >= 16 and self.val_scenes >= 4, "visual.scenes", self.scenes,
                 "an integer >= 16 (and visual.val_scenes >= 4)")
        _require(self.patch >= 1 and self.image_size % self.patch == 0 and self.image_size >= 2 * self.patch,
                 "visual.image_size", self.image_size, f"a multiple of visual.patch={self.patch}, at least twice it")
        _require(self.ids != "oracle" or (self.k >= 37 and self.data is None), "visual.ids", self.ids,
                 "oracle only on the embedded scenes (no visual.data) and with visual.k >= 37")
        _require(self.encoder_steps >= 1, "visual.encoder_steps", self.encoder_steps, "an integer >= 1")
        _require(math.isfinite(self.feature_noise) and self.feature_noise >= 0, "visual.feature_noise",
                 self.feature_noise, "a finite number >= 0 (noise sd in units of each feature's sd)")
        _require(self.features or self.feature_noise == 0, "visual.feature_noise", self.feature_noise,
                 "0 when visual.features=false (no features reach the LM to add noise to)")
        _require(self.caption_len >= 4, "visual.caption_len", self.caption_len, "an integer >= 4")
        _require(self.ids not in ("lfq", "bsq") or (self.k & (self.k - 1) == 0), "visual.k", self.k,
                 f"a power of two for visual.ids={self.ids} (K = 2^bits)")
        _require(self.quantizer_lr > 0, "visual.quantizer_lr", self.quantizer_lr, "a number > 0")
        _require(self.quantizer_batch >= 1, "visual.quantizer_batch", self.quantizer_batch, "an integer >= 1")
        _require_choice(self.injection, "visual.injection", Injection)
        _require(math.isfinite(self.loss_weight) and self.loss_weight >= 0, "visual.loss_weight", self.loss_weight,
                 "a finite number >= 0 (λ of L_visual)")
        _require(self.loss_weight == 0 or self.ids != "none", "visual.loss_weight", self.loss_weight,
                 "0 when visual.ids=none (the visual loss predicts visual IDs: pick a tokenizer)")
        _require(self.ids != "none" or (self.table and self.injection == "per-layer"), "visual.ids", self.ids,
                 "a tokenizer when visual.table or visual.injection is set (with ids=none there are no IDs)")
        _require(self.table or self.injection == "per-layer", "visual.injection", self.injection,
                 "per-layer when visual.table=false (no table: nothing to inject)")
        _require(self.table or self.loss_weight > 0 or self.ids == "none", "visual.table", self.table,
                 "true unless visual.loss_weight > 0 (no table and no visual loss: the IDs are unused, that is "
                 "visual.ids=none)")

    @property
    def per_layer_table(self) -> bool:
        """Whether the run has the per-layer visual table ``[K, L·dP]``."""
        return self.ids != "none" and self.table and self.injection == "per-layer"
