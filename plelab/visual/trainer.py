"""Training a visual run: the text trainer's loop, checkpoints, resume, metrics and diagnostics,
with image–caption batches and :class:`~plelab.visual.model.VisualPLEModel`.

A step: scenes ``sampler.batch(step)`` → (frozen features, visual IDs, caption words) → per-token
caption CE → mean over real tokens → backward → AdamW (the LM's groups, the projector with weight
decay, the visual table with the table learning rate and no decay). Validation: the mean caption
loss on the validation scenes; at the end the summary also gets the loss on content and template
words and with the image removed.

With an online quantizer (``visual.ids`` vq / lfq / bsq, ``visual.online``) the step's IDs come from
the quantizer as it is, then the quantizer takes its own update (:mod:`plelab.visual.online`); the
validation IDs are re-assigned at every evaluation, where the flip meter also records the probe
set's IDs (a frozen quantizer is metered the same way and must measure 0).
"""

from __future__ import annotations

import torch

from plelab.config.schema import QUANTIZER_IDS, RunConfig
from plelab.diagnostics.live import RowCounter
from plelab.errors import PlelabError
from plelab.model.init import param_seed
from plelab.train.optim import adamw, optimizer_groups
from plelab.train.trainer import Trainer, TrainResult
from plelab.visual.data import SceneSampler, VisualData, caption_losses, prepare_visual
from plelab.visual.diagnostics import COUNT_KEYS, end_of_run, gradient_per_row, table_weights
from plelab.visual.flips import FlipMeter, flip_stats
from plelab.visual.metrics import id_report
from plelab.visual.model import build_visual_model
from plelab.visual.online import QuantizerTrainer
from plelab.visual.text import PAD

PROBE_SCENES = 256  # scenes whose patch IDs the stability check looks up twice


class VisualTrainer(Trainer):
    def __init__(self, cfg: RunConfig, data: VisualData, run_dir=None, **kw) -> None:
        cfg.validate()  # the visual settings' cross-checks (visual table needs PLE; no text iid ids)
        cfg.model.vocab_size = len(data.vocab)  # the caption vocabulary decides it
        v = cfg.visual
        table_rows = v.k if v.per_layer_table and cfg.ple.enabled else 0
        self.visual_rows = RowCounter(table_rows, torch.device("cpu")) if table_rows else None
        self.loss_weight = v.loss_weight
        self.step_ids: dict[int, torch.Tensor | None] = {}  # this step's IDs per micro-batch (for a NaN replay)
        quantized = v.ids in QUANTIZER_IDS
        self.qt = QuantizerTrainer(cfg, data.train_feats, data.train_pixels) if quantized and v.online else None
        self.val_ids = data.val_ids
        self.flips = None
        if quantized:
            probe = data.train_feats[:PROBE_SCENES].flatten(0, 1)
            self.flips = FlipMeter(probe, v.k)
        super().__init__(cfg, data, run_dir, **kw)
        if self.dist.enabled:  # row counts, the quantizer and the flip meter are per process
            raise PlelabError("visual runs are single-process for now; run them without torchrun")
        if self.flips is not None and self.flips.last is None:
            self.flips.record(self.step, self.quantizer)
        if self.qt is not None:
            self.val_ids = self.qt.assign(data.val_feats)

    @property
    def quantizer(self):
        """The run's quantizer (online: the one training; frozen: the pretrained one), or None."""
        return self.qt.quantizer if self.qt is not None else self.data.quantizer

    def _build_model(self) -> torch.nn.Module:
        v, c = self.cfg.visual, self.cfg
        k = v.k if v.ids != "none" else 0
        return build_visual_model(c.model, c.ple, self.data.feature_dim, self.data.num_patches, k, c.seed, self.device,
                                  use_features=v.features, injection=v.injection if v.table else "none",
                                  visual_head=v.loss_weight > 0)

    def _build_optimizer(self) -> torch.optim.Optimizer:
        tc = self.cfg.train
        groups = optimizer_groups(self.model.lm, tc)
        if self.model.use_features:
            groups.append({"name": "projector", "params": [self.model.projector.weight], "lr": tc.lr,
                           "base_lr": tc.lr, "weight_decay": tc.weight_decay})
        else:
            groups.append({"name": "image_embed", "params": [self.model.image_embed], "lr": tc.lr, "base_lr": tc.lr,
                           "weight_decay": 0.0})
        table_lr = (tc.lr if tc.table_lr is None else tc.table_lr) * tc.table_lr_mult
        m = self.model
        # the layer-0 ID embedding gets the visual table's settings: the ablation changes the injection only
        for name, table in (("visual_table", m.visual_embed_tokens_per_layer if m.num_ids else None),
                            ("visual_embed", m.visual_embed_tokens if m.layer0 else None)):
            if table is not None:
                groups.append({"name": name, "params": [table.weight], "lr": table_lr, "base_lr": table_lr,
                               "weight_decay": tc.table_weight_decay})
        if m.visual_lm_head is not None:
            groups.append({"name": "visual_head", "params": [m.visual_lm_head.weight], "lr": tc.lr, "base_lr": tc.lr,
                           "weight_decay": tc.weight_decay})
        assert sum(len(g["params"]) for g in groups) == sum(p.requires_grad for p in self.model.parameters())
        return adamw(groups)

    def _setup_data(self) -> None:
        self.sampler = SceneSampler(len(self.data.train_caps), self.cfg.seed)
        self.val = torch.arange(len(self.data.val_caps))
        # every position of the sequence is computed: the image prefix and the (padded) caption
        self.tokens_per_step = self.cfg.train.batch_size * (self.data.num_patches + self.data.train_caps.shape[1])

    def _micro_loss(self, step: int, micro: int, rows: slice) -> torch.Tensor:
        idx = self.sampler.batch(step, self.cfg.train.batch_size, rows)
        if self.replaying:  # the trainer re-runs this step to locate a NaN: the same IDs, nothing updated
            ids = self.step_ids[micro]
        elif self.qt is not None:  # the quantizer as it is now; it updates after the last micro-batch
            ids = self.qt.assign(self.data.train_feats[idx])
            if micro == self.cfg.train.grad_accum - 1:
                self.qt.step()
        else:
            gen = torch.Generator().manual_seed(param_seed(self.cfg.seed, f"vis:{step}:{self.dist.rank}:{micro}"))
            ids = self.data.batch_ids(idx, gen)
        if not self.replaying:
            self.step_ids = {**(self.step_ids if micro else {}), micro: ids}
            if self.visual_rows is not None:
                self.visual_rows.update(ids)
        caps = self.data.train_caps[idx].to(self.device)
        feats, ids = self.data.train_feats[idx].to(self.device), None if ids is None else ids.to(self.device)
        if not self.loss_weight:
            return self.forward(feats, ids, caps).sum() / (caps != PAD).sum()
        per_token, visual = self.forward(feats, ids, caps, return_visual=True)
        return per_token.sum() / (caps != PAD).sum() + self.loss_weight * visual.mean()  # L_text + λ·L_visual

    def _diag_windows(self) -> None:
        return None  # the checkpoint use test runs on text windows; visual runs have theirs at the end

    def _checkpoint_extra(self) -> dict[str, torch.Tensor]:
        out = {} if self.visual_rows is None else {COUNT_KEYS["visual"]: self.visual_rows.counts.clone()}
        if self.qt is not None:
            out.update(self.qt.state())
        if self.flips is not None and self.flips.last is not None:
            out["flips.last"] = self.flips.last.clone()
        return out

    def _state_extra(self) -> dict:
        return {} if self.flips is None else {"flips": {"rows": self.flips.rows, "last_step": self.flips.last_step}}

    def _restore_extra(self, saved: dict[str, torch.Tensor], state: dict) -> None:
        if self.visual_rows is not None and COUNT_KEYS["visual"] in saved:
            self.visual_rows.counts.copy_(saved[COUNT_KEYS["visual"]])
        if self.qt is not None:
            self.qt.load_state(saved)
        if self.flips is not None and "flips.last" in saved:
            self.flips.last, self.flips.rows = saved["flips.last"], state["flips"]["rows"]
            self.flips.last_step = state["flips"]["last_step"]

    def _live_extra(self) -> dict:
        """Mean gradient norm per used row, per layer, arriving at each table (the seed's attenuated path)."""
        L, dP = self.cfg.model.num_hidden_layers, self.cfg.ple.dim
        return {f"grad_row_{name}": gradient_per_row(w, L, dP) for name, w in table_weights(self.model).items()}

    def table_counts(self) -> dict:
        """How often each row of each table was looked up in training."""
        out = {"text": self.rows.counts.cpu().numpy().astype(float)}
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
        gens = [torch.Generator().manual_seed(param_seed(self.cfg.seed, f"flip{i}")) for i in range(2)]
        first, second = (self.data.batch_ids(probe, g) for g in gens)
        return flip_stats(first, second, self.cfg.visual.k)

    @torch.no_grad()
    def _val_per_token(self, drop_image: bool = False, visual: bool = False):
        """Validation caption CE per token ``[N, T]`` (with ``visual``: also the next-ID CE ``[N, P−1]``)."""
        d, text, vis = self.data, [], []
        self.model.eval()
        for i in range(0, len(d.val_caps), 64):
            ids = None if self.val_ids is None else self.val_ids[i:i + 64].to(self.device)
            with self._autocast():
                out = self.model(d.val_feats[i:i + 64].to(self.device), ids, d.val_caps[i:i + 64].to(self.device),
                                 drop_image=drop_image, return_visual=visual)
            text.append((out[0] if visual else out).float().cpu())
            if visual:
                vis.append(out[1].float().cpu())
        self.model.train()
        return (torch.cat(text), torch.cat(vis)) if visual else torch.cat(text)

    def evaluate(self) -> float:
        if self.flips is not None and self.step > self.flips.last_step:
            self.flips.record(self.step, self.quantizer)
        if self.qt is not None:
            self.val_ids = self.qt.assign(self.data.val_feats)
        caps = self.data.val_caps
        return float(self._val_per_token().sum() / (caps != PAD).sum())

    def caption_report(self) -> dict:
        d = self.data
        with_image = caption_losses(self._val_per_token(), d.val_caps, d.val_content)
        without = caption_losses(self._val_per_token(drop_image=True), d.val_caps, d.val_content)
        return {**with_image, **{f"no_image_{k}": v for k, v in without.items()}}

    def _summary_extra(self) -> dict:
        v, metrics, quantizer = self.cfg.visual, self.data.id_metrics, {}
        if self.qt is not None:  # the IDs the online quantizer gives at the end
            metrics = id_report(self.val_ids, v.k, self.data.val_labels)
        if self.flips is not None:
            quantizer = {"kind": v.ids, "online": v.online,
                         "final_losses": self.qt.last_losses if self.qt is not None else None}
        extra = {}
        if self.model.visual_lm_head is not None and self.val_ids is not None:
            extra["visual_loss"] = float(self._val_per_token(visual=True)[1].mean())  # L_visual on held-out scenes
        return {"visual": {"ids": v.ids, "id_metrics": metrics, "id_stability": self.id_stability(),
                           "quantizer": quantizer, **self.caption_report(), **extra, "tables": end_of_run(self)}}


def train_visual(cfg: RunConfig, out_dir=None, progress: bool = True, resume: bool = False, log=print,
                 data: VisualData | None = None) -> TrainResult:
    """Prepare the visual data (unless given) and run a :class:`VisualTrainer` to ``cfg.train.steps``."""
    data = data or prepare_visual(cfg, log=log if progress else None)
    return VisualTrainer(cfg, data, out_dir, resume=resume, progress=progress, log=log).fit()
