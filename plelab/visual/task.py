"""The visual run as a :class:`~plelab.training.task.Task`: image–caption batches and
:class:`~plelab.visual.model.VisualPLEModel` inside the shared trainer.

A batch: scenes ``sampler.batch(step)`` → (frozen features, visual IDs, caption words); its loss is the
per-token caption CE averaged over real tokens (``+ λ·L_visual`` with a visual head). Parameter groups: the
LM's, the projector with weight decay, the visual table with the table learning rate and no decay. Validation:
the mean caption loss on the validation scenes; at the end the summary also gets the loss on content and
template words and with the image removed, and both tables' diagnostics.

With an online quantizer (``visual.ids`` vq / lfq / bsq, ``visual.online``) a batch's IDs come from the
quantizer as it is when the step starts (stored in the batch, so a NaN replay reuses them); after the step the
quantizer takes its own update (:mod:`plelab.visual.online`). The validation IDs are re-assigned at every
evaluation, where the flip meter also records the probe set's IDs (a frozen quantizer is metered the same
way and must measure 0). The visual table's lookups are counted as the batches are made.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from plelab.config.schema import QUANTIZER_IDS, RunConfig
from plelab.errors import PlelabError
from plelab.model.ple import token_table_ids
from plelab.runtime import seeded_generator
from plelab.training.optim import adamw_group, optimizer_groups, table_lr
from plelab.training.rows import RowCounter
from plelab.training.task import Batch, Kind, Task, register_task_kind
from plelab.training.text_task import TEXT_ROWS_KEY
from plelab.visual.data import VisualData, caption_losses, prepare_visual, warm_encoder
from plelab.visual.diagnostics import COUNT_KEYS, end_of_run, gradient_per_row, table_weights
from plelab.visual.flips import FlipMeter, flip_stats
from plelab.visual.metrics import id_report
from plelab.visual.model import build_visual_model
from plelab.visual.online import QuantizerTrainer
from plelab.visual.sampler import SceneSampler
from plelab.visual.text import PAD

PROBE_SCENES = 256  # scenes whose patch IDs the stability check looks up twice


def resolved_visual_config(cfg: RunConfig, data: VisualData) -> RunConfig:
    """A validated copy of ``cfg`` with ``model.vocab_size`` set from the caption vocabulary (the caller's
    config is left as it is)."""
    out = copy.deepcopy(cfg)
    out.validate()  # the visual settings' cross-checks (visual table needs PLE; no text iid ids)
    out.model.vocab_size = len(data.vocab)
    return out.validate()


class VisualTask(Task):
    single_process = True  # row counts, the quantizer and the flip meter are per process

    def __init__(self, cfg: RunConfig, data: VisualData) -> None:
        self.cfg, self.data = resolved_visual_config(cfg, data), data
        cfg, v = self.cfg, self.cfg.visual
        table_rows = v.k if v.per_layer_table and cfg.ple.enabled else 0
        self.visual_rows = RowCounter(table_rows, torch.device("cpu")) if table_rows else None
        self.row_tables = ({"text": (cfg.ple.resolved_vocab_size(cfg.model), TEXT_ROWS_KEY)}
                           if cfg.ple.enabled else {})
        quantized = v.ids in QUANTIZER_IDS
        self.qt = QuantizerTrainer(cfg, data.train_feats, data.train_pixels) if quantized and v.online else None
        self.val_ids = data.val_ids
        self.flips = FlipMeter(data.train_feats[:PROBE_SCENES].flatten(0, 1), v.k) if quantized else None
        self.sampler = SceneSampler(len(data.train_caps), cfg.seed)
        self.val = torch.arange(len(data.val_caps))
        # every position of the sequence is computed: the image prefix and the (padded) caption
        self.tokens_per_step = cfg.train.batch_size * (data.num_patches + data.train_caps.shape[1])

    @property
    def quantizer(self):
        """The run's quantizer (online: the one training; frozen: the pretrained one), or None."""
        return self.qt.quantizer if self.qt is not None else self.data.quantizer

    def build_model(self, table_device: str | None, table_sparse: bool,
                    shard: Callable[[nn.Module], None] | None = None) -> nn.Module:
        if shard is not None:
            raise PlelabError("a visual run is single-process: it cannot be sharded (train.parallel=fsdp)")
        v, c = self.cfg.visual, self.cfg
        k = v.k if v.ids != "none" else 0
        return build_visual_model(c.model, c.ple, self.data.feature_dim, self.data.num_patches, k, c.seed,
                                  self.env.device, use_features=v.features,
                                  injection=v.injection if v.table else "none", visual_head=v.loss_weight > 0,
                                  activation_checkpointing=c.train.activation_checkpointing)

    def language_model(self, model: nn.Module) -> nn.Module:
        return model.lm

    def param_groups(self, model: nn.Module) -> list[dict]:
        tc = self.cfg.train
        groups = optimizer_groups(model.lm, tc)
        if model.use_features:
            groups.append(adamw_group("projector", [model.projector.weight], tc.lr, tc.weight_decay))
        else:
            groups.append(adamw_group("image_embed", [model.image_embed], tc.lr, 0.0))
        # the layer-0 ID embedding gets the visual table's settings: the ablation changes the injection only
        for name, table in (("visual_table", model.visual_embed_tokens_per_layer if model.num_ids else None),
                            ("visual_embed", model.visual_embed_tokens if model.layer0 else None)):
            if table is not None:
                groups.append(adamw_group(name, [table.weight], table_lr(tc), tc.table_weight_decay))
        if model.visual_lm_head is not None:
            groups.append(adamw_group("visual_head", [model.visual_lm_head.weight], tc.lr, tc.weight_decay))
        assert sum(len(g["params"]) for g in groups) == sum(p.requires_grad for p in model.parameters())
        return groups

    def batch(self, step: int, micro: int, rows: slice) -> Batch:
        idx = self.sampler.batch(step, self.cfg.train.batch_size, rows)
        if self.qt is not None:  # the quantizer as it is now (it updates after the step)
            ids = self.qt.assign(self.data.train_feats[idx])
        else:
            gen = seeded_generator(self.cfg.seed, f"vis:{step}:{self.env.dist.rank}:{micro}")
            ids = self.data.batch_ids(idx, gen)
        if self.visual_rows is not None:
            self.visual_rows.update(ids)
        device = self.env.device
        caps = self.data.train_caps[idx].to(device)
        inputs = {"features": self.data.lm_train_feats[idx].to(device),
                  "patch_ids": None if ids is None else ids.to(device), "captions": caps}
        rows = {name: token_table_ids(caps, n) for name, (n, _) in self.row_tables.items()}  # the caption's text rows
        return Batch(inputs, rows)

    def loss(self, forward: Callable, batch: Batch) -> torch.Tensor:
        x = batch.inputs
        real = (x["captions"] != PAD).sum()
        if not self.cfg.visual.loss_weight:
            return forward(x["features"], x["patch_ids"], x["captions"]).sum() / real
        per_token, visual = forward(x["features"], x["patch_ids"], x["captions"], return_visual=True)
        return per_token.sum() / real + self.cfg.visual.loss_weight * visual.mean()  # L_text + λ·L_visual

    def after_step(self, step: int) -> None:
        if self.qt is not None:
            self.qt.step()

    def ready(self, step: int) -> None:
        if self.flips is not None and self.flips.last is None:
            self.flips.record(step, self.quantizer)
        if self.qt is not None:
            self.val_ids = self.qt.assign(self.data.val_feats)

    def epochs(self, steps: int) -> float:
        return self.sampler.epochs(steps, self.cfg.train.batch_size)

    def live_metrics(self, model: nn.Module) -> dict:
        """Mean gradient norm per used row, per layer, arriving at each table (the seed's attenuated path)."""
        L, dP = self.cfg.model.num_hidden_layers, self.cfg.ple.dim
        return {f"grad_row_{name}": gradient_per_row(w, L, dP) for name, w in table_weights(model).items()}

    # ---- checkpoint state -----------------------------------------------------------------------
    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        out = {} if self.visual_rows is None else {COUNT_KEYS["visual"]: self.visual_rows.counts.clone()}
        if self.qt is not None:
            out.update(self.qt.state())
        if self.flips is not None and self.flips.last is not None:
            out["flips.last"] = self.flips.last.clone()
        return out

    def checkpoint_state(self) -> dict:
        return {} if self.flips is None else {"flips": {"rows": self.flips.rows, "last_step": self.flips.last_step}}

    def restore(self, tensors: dict[str, torch.Tensor], state: dict) -> None:
        if self.visual_rows is not None and COUNT_KEYS["visual"] in tensors:
            self.visual_rows.counts.copy_(tensors[COUNT_KEYS["visual"]])
        if self.qt is not None:
            self.qt.load_state(tensors)
        if self.flips is not None and "flips.last" in tensors:
            self.flips.last, self.flips.rows = tensors["flips.last"], state["flips"]["rows"]
            self.flips.last_step = state["flips"]["last_step"]

    # ---- evaluation and the end-of-run report ------------------------------------------------------
    @torch.no_grad()
    def val_per_token(self, model: nn.Module, drop_image: bool = False, visual: bool = False):
        """Validation caption CE per token ``[N, T]`` (with ``visual``: also the next-ID CE ``[N, P−1]``)."""
        d, text, vis = self.data, [], []
        was = model.training
        model.eval()
        for i in range(0, len(d.val_caps), 64):
            ids = None if self.val_ids is None else self.val_ids[i:i + 64].to(self.env.device)
            with self.env.autocast():
                out = model(d.lm_val_feats[i:i + 64].to(self.env.device), ids, d.val_caps[i:i + 64].to(self.env.device),
                            drop_image=drop_image, return_visual=visual)
            text.append((out[0] if visual else out).float().cpu())
            if visual:
                vis.append(out[1].float().cpu())
        model.train(was)
        return (torch.cat(text), torch.cat(vis)) if visual else torch.cat(text)

    def evaluate(self, model: nn.Module, step: int) -> float:
        if self.flips is not None and step > self.flips.last_step:
            self.flips.record(step, self.quantizer)
        if self.qt is not None:
            self.val_ids = self.qt.assign(self.data.val_feats)
        return float(self.val_per_token(model).sum() / (self.data.val_caps != PAD).sum())

    def table_counts(self, counts: dict[str, torch.Tensor]) -> dict:
        """How often each row of each table was looked up in training."""
        out = {"text": counts["text"].cpu().numpy().astype(float)}
        out["text"][PAD] = 0  # <pad> is looked up at every padded position but gets no gradient
        if self.visual_rows is not None:
            out["visual"] = self.visual_rows.counts.numpy().astype(float)
        return out

    def id_stability(self) -> dict | None:
        """Quantizers: the flip meter's summary over the evaluation intervals (with restart events).
        Other methods: the flip rate between two lookups of the same training patches (0 when fixed)."""
        if self.cfg.visual.ids == "none":
            return None
        if self.flips is not None:
            restarts = getattr(self.quantizer, "restarts", [])
            return {**self.flips.summary(), "restart_events": len(restarts),
                    "codes_restarted": sum(len(c) for _, c in restarts), "intervals_detail": self.flips.rows}
        probe = torch.arange(min(PROBE_SCENES, len(self.data.train_caps)))
        gens = [seeded_generator(self.cfg.seed, f"flip{i}") for i in range(2)]
        first, second = (self.data.batch_ids(probe, g) for g in gens)
        return flip_stats(first, second, self.cfg.visual.k)

    def caption_report(self, model: nn.Module) -> dict:
        d = self.data
        with_image = caption_losses(self.val_per_token(model), d.val_caps, d.val_content)
        without = caption_losses(self.val_per_token(model, drop_image=True), d.val_caps, d.val_content)
        return {**with_image, **{f"no_image_{k}": v for k, v in without.items()}}

    def summary(self, model: nn.Module, step: int, counts: dict[str, torch.Tensor]) -> dict:
        v, metrics, quantizer = self.cfg.visual, self.data.id_metrics, {}
        if self.qt is not None:  # the IDs the online quantizer gives at the end
            metrics = id_report(self.val_ids, v.k, self.data.val_labels)
        if self.flips is not None:
            quantizer = {"kind": v.ids, "online": v.online,
                         "final_losses": self.qt.last_losses if self.qt is not None else None}
        extra = {}
        if model.visual_lm_head is not None and self.val_ids is not None:
            extra["visual_loss"] = float(self.val_per_token(model, visual=True)[1].mean())  # L_visual, held out
        tables = end_of_run(self, model, step, self.table_counts(counts)) if self.cfg.ple.enabled else {}
        return {"visual": {"ids": v.ids, "id_metrics": metrics, "id_stability": self.id_stability(),
                           "quantizer": quantizer, **self.caption_report(model), **extra, "tables": tables}}


def _describe(cfg: RunConfig, data: VisualData) -> str:
    return f"{len(data.train_caps):,} train / {len(data.val_caps):,} validation image–caption pairs"


def _data_key(cfg: RunConfig) -> dict:
    """What a visual run's data depend on: the visual section but the table, its injection and the loss weight."""
    key = {k: v for k, v in cfg.visual.__dict__.items() if k not in ("table", "injection", "loss_weight")}
    if cfg.visual.ids in QUANTIZER_IDS and not cfg.visual.online:
        key["pretrain_steps"] = cfg.train.steps  # the frozen quantizer is pretrained for train.steps
    return key


register_task_kind(Kind(
    name="visual",
    prepare_data=lambda cfg, progress=True, dist=None: prepare_visual(cfg, log=print if progress else None),
    make_task=VisualTask, describe_data=_describe, warm_caches=warm_encoder, data_key=_data_key,
    text_model=False, trains_bpe=False, exportable=False))
