"""Training a visual run: the text trainer's loop, checkpoints, resume, metrics and diagnostics,
with image–caption batches and :class:`~plelab.visual.model.VisualPLEModel`.

A step: scenes ``sampler.batch(step)`` → (frozen features, visual IDs, caption words) → per-token
caption CE → mean over real tokens → backward → AdamW (the LM's groups, the projector with weight
decay, the visual table with the table learning rate and no decay). Validation: the mean caption
loss on the validation scenes; at the end the summary also gets the loss on content and template
words and with the image removed.
"""

from __future__ import annotations

import torch

from plelab.config.schema import RunConfig
from plelab.diagnostics.live import RowCounter
from plelab.model.init import param_seed
from plelab.train.optim import adamw, optimizer_groups
from plelab.train.trainer import Trainer, TrainResult
from plelab.visual.data import VisualData, caption_losses, prepare_visual
from plelab.visual.diagnostics import COUNT_KEYS, end_of_run, gradient_per_row, table_weights
from plelab.visual.metrics import id_stability
from plelab.visual.model import build_visual_model
from plelab.visual.text import PAD


class SceneSampler:
    """A fresh permutation of the training scenes every epoch, from the run seed (one cached at a time)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed
        self._epoch, self._perm = -1, None

    def _permutation(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:
            gen = torch.Generator().manual_seed(param_seed(self.seed, f"e{epoch}"))
            self._epoch, self._perm = epoch, torch.randperm(self.n, generator=gen)
        return self._perm

    def batch(self, step: int, batch_size: int, rows: slice = slice(None)) -> torch.Tensor:
        positions = range(step * batch_size, (step + 1) * batch_size)[rows]
        return torch.tensor([int(self._permutation(pos // self.n)[pos % self.n]) for pos in positions],
                            dtype=torch.long)

    def epochs(self, step: int, batch_size: int) -> float:
        return step * batch_size / self.n


PROBE_SCENES = 256  # scenes whose patch IDs the stability check looks up twice


class VisualTrainer(Trainer):
    def __init__(self, cfg: RunConfig, data: VisualData, run_dir=None, **kw) -> None:
        cfg.validate()  # the visual settings' cross-checks (visual table needs PLE; no text iid ids)
        cfg.model.vocab_size = len(data.vocab)  # the caption vocabulary decides it
        k = cfg.visual.k if cfg.visual.ids != "none" and cfg.ple.enabled else 0
        self.visual_rows = RowCounter(k, torch.device("cpu")) if k else None
        super().__init__(cfg, data, run_dir, **kw)

    def _build_model(self) -> torch.nn.Module:
        v, c = self.cfg.visual, self.cfg
        k = v.k if v.ids != "none" else 0
        return build_visual_model(c.model, c.ple, self.data.feature_dim, self.data.num_patches, k, c.seed, self.device,
                                  use_features=v.features)

    def _build_optimizer(self) -> torch.optim.Optimizer:
        tc = self.cfg.train
        groups = optimizer_groups(self.model.lm, tc)
        if self.model.use_features:
            groups.append({"name": "projector", "params": [self.model.projector.weight], "lr": tc.lr,
                           "base_lr": tc.lr, "weight_decay": tc.weight_decay})
        else:
            groups.append({"name": "image_embed", "params": [self.model.image_embed], "lr": tc.lr, "base_lr": tc.lr,
                           "weight_decay": 0.0})
        if self.model.num_ids:
            lr = (tc.lr if tc.table_lr is None else tc.table_lr) * tc.table_lr_mult
            groups.append({"name": "visual_table", "params": [self.model.visual_embed_tokens_per_layer.weight],
                           "lr": lr, "base_lr": lr, "weight_decay": tc.table_weight_decay})
        assert sum(len(g["params"]) for g in groups) == sum(p.requires_grad for p in self.model.parameters())
        return adamw(groups)

    def _setup_data(self) -> None:
        self.sampler = SceneSampler(len(self.data.train_caps), self.cfg.seed)
        self.val = torch.arange(len(self.data.val_caps))
        # every position of the sequence is computed: the image prefix and the (padded) caption
        self.tokens_per_step = self.cfg.train.batch_size * (self.data.num_patches + self.data.train_caps.shape[1])

    def _micro_loss(self, step: int, micro: int, rows: slice) -> torch.Tensor:
        idx = self.sampler.batch(step, self.cfg.train.batch_size, rows)
        gen = torch.Generator().manual_seed(param_seed(self.cfg.seed, f"vis:{step}:{self.dist.rank}:{micro}"))
        ids = self.data.batch_ids(idx, gen)
        if self.visual_rows is not None:
            self.visual_rows.update(ids)
        caps = self.data.train_caps[idx].to(self.device)
        per_token = self.forward(self.data.train_feats[idx].to(self.device),
                                 None if ids is None else ids.to(self.device), caps)
        return per_token.sum() / (caps != PAD).sum()

    def _diag_windows(self) -> None:
        return None  # the checkpoint use test runs on text windows; visual runs have theirs at the end

    def _checkpoint_extra(self) -> dict[str, torch.Tensor]:
        return {} if self.visual_rows is None else {COUNT_KEYS["visual"]: self.visual_rows.counts.clone()}

    def _restore_extra(self, saved: dict[str, torch.Tensor]) -> None:
        if self.visual_rows is not None and COUNT_KEYS["visual"] in saved:
            self.visual_rows.counts.copy_(saved[COUNT_KEYS["visual"]])

    def _live_extra(self) -> dict:
        """Mean gradient norm per used row, per layer, arriving at each table (the seed's attenuated path)."""
        L, dP = self.cfg.model.num_hidden_layers, self.cfg.ple.dim
        return {f"grad_row_{name}": gradient_per_row(w, L, dP) for name, w in table_weights(self.model).items()}

    def table_counts(self) -> dict:
        """How often each row of each table was looked up in training."""
        out = {"text": self.rows.counts.cpu().numpy().astype(float)}
        if self.visual_rows is not None:
            out["visual"] = self.visual_rows.counts.numpy().astype(float)
        return out

    def id_stability(self) -> dict | None:
        """Flip rate of the IDs two lookups of the same training patches give (0 for a frozen tokenizer)."""
        if self.visual_rows is None:
            return None
        probe = torch.arange(min(PROBE_SCENES, len(self.data.train_caps)))
        gens = [torch.Generator().manual_seed(param_seed(self.cfg.seed, f"flip{i}")) for i in range(2)]
        first, second = (self.data.batch_ids(probe, g) for g in gens)
        return id_stability(first, second, self.cfg.visual.k)

    @torch.no_grad()
    def _val_per_token(self, drop_image: bool = False) -> torch.Tensor:
        d, out = self.data, []
        self.model.eval()
        for i in range(0, len(d.val_caps), 64):
            ids = None if d.val_ids is None else d.val_ids[i:i + 64].to(self.device)
            with self._autocast():
                out.append(self.model(d.val_feats[i:i + 64].to(self.device), ids, d.val_caps[i:i + 64].to(self.device),
                                      drop_image=drop_image).float().cpu())
        self.model.train()
        return torch.cat(out)

    def evaluate(self) -> float:
        caps = self.data.val_caps
        return float(self._val_per_token().sum() / (caps != PAD).sum())

    def caption_report(self) -> dict:
        d = self.data
        with_image = caption_losses(self._val_per_token(), d.val_caps, d.val_content)
        without = caption_losses(self._val_per_token(drop_image=True), d.val_caps, d.val_content)
        return {**with_image, **{f"no_image_{k}": v for k, v in without.items()}}

    def _summary_extra(self) -> dict:
        return {"visual": {"ids": self.cfg.visual.ids, "id_metrics": self.data.id_metrics,
                           "id_stability": self.id_stability(), **self.caption_report(), "tables": end_of_run(self)}}


def train_visual(cfg: RunConfig, out_dir=None, progress: bool = True, resume: bool = False, log=print,
                 data: VisualData | None = None) -> TrainResult:
    """Prepare the visual data (unless given) and run a :class:`VisualTrainer` to ``cfg.train.steps``."""
    data = data or prepare_visual(cfg, log=log if progress else None)
    return VisualTrainer(cfg, data, out_dir, resume=resume, progress=progress, log=log).fit()
