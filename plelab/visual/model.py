"""The multimodal PLE model: frozen patch features → projector → an image prefix of P positions,
then the caption's word tokens, through the plelab LM (causal over the whole sequence).

Per-layer inputs (``docs/ple.md`` §1.2 with the token part replaced per position):

    image position p:  z = sqrt(dP) · V[id_p]   (the visual per-layer table, [K, L·dP], keyed by the
                                                patch's visual ID; zeros when there is no visual table)
    text position t:   z = sqrt(dP) · T[x_t]    (the text per-layer table, as in text-only runs)
    every position:    P = (RMSNorm_dP(W_m e · H^-½) + z) · 2^-½, injected by each layer's gate / projection

The visual table has no padding row (every ID is trainable). With ``use_features=False`` the
continuous features are withheld: every image position gets one learned embedding ``image_embed``,
so the image reaches the model only through the visual IDs. Its tensor name is
``visual_embed_tokens_per_layer.weight``; the LM keeps its HF names under ``lm.``. Loss: next-token
cross-entropy on caption tokens only (the image prefix is context), returned per token so that the
study can split it into content and template words.

Two variants for the fix and the ablation (issue 8): ``injection="layer0"`` replaces the per-layer
table by one ID embedding ``visual_embed_tokens`` [K, H] added to the image positions' input
(``sqrt(H)·E_v[id_p]``, like a token embedding); ``visual_head`` adds ``visual_lm_head`` [K, H] that
predicts the next patch's ID from each image position's final hidden state (raster order):
``L_visual = CE(head(h_p), id_{p+1})`` for p < P−1. The LM's attention is causal over the whole
sequence, image prefix included, so position p never attends to patch p+1. The continuous features
are another matter: the frozen ViT encoder attends bidirectionally, so patch p's feature carries
some of patch p+1's content and the next ID is partly predictable from the input itself; withhold
the features (``visual.features=false``) for a next-ID task with no such path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from plelab.model.init import build_model, initial_normal, table_init_std
from plelab.model.transformer import PLECausalLM
from plelab.visual.text import PAD

VISUAL_TABLE = "visual_embed_tokens_per_layer.weight"
VISUAL_EMBED = "visual_embed_tokens.weight"
VISUAL_HEAD = "visual_lm_head.weight"
PROJECTOR = "projector.weight"
IMAGE_EMBED = "image_embed"


class VisualPLEModel(nn.Module):
    def __init__(self, lm: PLECausalLM, feature_dim: int, num_patches: int, num_ids: int,
                 use_features: bool = True, injection: str = "per-layer", visual_head: bool = False) -> None:
        super().__init__()
        mc, pc = lm.mc, lm.pc
        self.lm, self.num_patches, self.use_features = lm, num_patches, use_features
        if use_features:
            self.projector = nn.Linear(feature_dim, mc.hidden_size, bias=False)
        else:  # features withheld: one learned embedding at every image position
            self.image_embed = nn.Parameter(torch.empty(mc.hidden_size))
        self.k = num_ids  # how many visual IDs there are (0: none)
        self.num_ids = num_ids if pc.enabled and injection == "per-layer" else 0  # rows of the per-layer table
        if self.num_ids:
            self.visual_embed_tokens_per_layer = nn.Embedding(self.num_ids, mc.num_hidden_layers * pc.dim)
        self.layer0 = bool(num_ids) and injection == "layer0"
        if self.layer0:
            self.visual_embed_tokens = nn.Embedding(num_ids, mc.hidden_size)
        self.visual_lm_head = nn.Linear(mc.hidden_size, num_ids, bias=False) if visual_head else None

    def sequence(self, features: torch.Tensor, patch_ids: torch.Tensor | None, captions: torch.Tensor,
                 drop_image: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``features [B,P,D]``, ``patch_ids [B,P]``, ``captions [B,T]`` -> (ids, embeddings ``[B,P+T,H]``,
        token part ``[B,P+T,L,dP]`` or None). ``drop_image`` zeroes the prefix and its table rows."""
        tm, pc = self.lm.model, self.lm.pc
        b, p = features.shape[:2]
        img = self.projector(features) if self.use_features else self.image_embed.expand(b, p, -1)
        if self.layer0 and patch_ids is not None:
            img = img + self.visual_embed_tokens(patch_ids) * self.lm.model.embed_scale
        if drop_image:
            img = torch.zeros_like(img)
        h = torch.cat([img, tm.embed(captions)], dim=1)
        ids = torch.cat([torch.zeros(b, p, dtype=captions.dtype, device=captions.device), captions], dim=1)
        if not pc.enabled:
            return ids, h, None
        z_txt = tm.per_layer_embedding.token_part(tm.table_ids(captions))
        if self.num_ids and patch_ids is not None and not drop_image:
            z_img = self.visual_embed_tokens_per_layer(patch_ids) * pc.embed_scale
            z_img = z_img.view(b, p, *z_txt.shape[2:])
        else:
            z_img = z_txt.new_zeros(b, p, *z_txt.shape[2:])
        return ids, h, torch.cat([z_img, z_txt], dim=1)

    def forward(self, features: torch.Tensor, patch_ids: torch.Tensor | None, captions: torch.Tensor,
                drop_image: bool = False, return_visual: bool = False):
        """Per-token next-token CE on the caption ``[B, T]`` (0 at ``<pad>`` positions).

        The caption's first token is predicted from the last image position, token t from t−1. With
        ``return_visual`` also the per-position next-ID CE ``[B, P−1]`` (None without a visual head).
        """
        ids, h, z = self.sequence(features, patch_ids, captions, drop_image)
        p, t = features.shape[1], captions.shape[1]
        hidden = self.lm.model(ids, inputs_embeds=h, token_part=z)
        logits = F.linear(hidden[:, p - 1:p - 1 + t], self.lm.output_weight()).float()
        text = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), captions.reshape(-1), ignore_index=PAD,
                               reduction="none").view_as(captions)
        if not return_visual:
            return text
        return text, self.visual_ce(hidden[:, :p], patch_ids)

    def visual_ce(self, image_hidden: torch.Tensor, patch_ids: torch.Tensor | None) -> torch.Tensor | None:
        """``L_visual`` per position: the head at image position p predicts ``id_{p+1}`` — ``[B, P−1]``."""
        if self.visual_lm_head is None or patch_ids is None:
            return None
        logits = self.visual_lm_head(image_hidden[:, :-1]).float()
        return F.cross_entropy(logits.reshape(-1, self.k), patch_ids[:, 1:].reshape(-1),
                               reduction="none").view(patch_ids.shape[0], -1)


def build_visual_model(mc, pc, feature_dim: int, num_patches: int, num_ids: int, seed: int = 0,
                       device: str | torch.device = "cpu", use_features: bool = True, injection: str = "per-layer",
                       visual_head: bool = False, activation_checkpointing: bool = False) -> VisualPLEModel:
    """The LM exactly as :func:`plelab.model.build_model` builds it for ``seed`` (so the trunk and the
    text table are identical across visual arms), plus the projector and the visual table, each drawn
    from its own name-seeded generator. ``activation_checkpointing`` recomputes the LM's layers in backward."""
    lm = build_model(mc, pc, seed=seed, device=device, activation_checkpointing=activation_checkpointing)
    model = VisualPLEModel(lm, feature_dim, num_patches, num_ids, use_features, injection, visual_head)
    with torch.no_grad():
        if use_features:
            model.projector.weight.copy_(initial_normal(PROJECTOR, tuple(model.projector.weight.shape), seed,
                                                        mc.initializer_range))
        else:
            model.image_embed.copy_(initial_normal(IMAGE_EMBED, (mc.hidden_size,), seed, mc.initializer_range))
        if model.num_ids:
            table = model.visual_embed_tokens_per_layer.weight
            table.copy_(initial_normal(VISUAL_TABLE, tuple(table.shape), seed, table_init_std(mc, pc)))
        for name, p in ((VISUAL_EMBED, model.visual_embed_tokens.weight if model.layer0 else None),
                        (VISUAL_HEAD, model.visual_lm_head.weight if model.visual_lm_head is not None else None)):
            if p is not None:
                p.copy_(initial_normal(name, tuple(p.shape), seed, mc.initializer_range))
    return model.to(device)
