"""One entry for every kind of run: the data a config needs and the trainer that runs it.

Text runs (the default) read a token stream (:func:`plelab.data.pipeline.prepare_data`) and use
:class:`~plelab.train.trainer.Trainer`; visual runs (``visual.enabled``) read image–caption data
(:func:`plelab.visual.data.prepare_visual`) and use :class:`~plelab.visual.trainer.VisualTrainer`.
``plelab train`` and the sweep runner both go through here.
"""

from __future__ import annotations

from plelab.config.schema import RunConfig
from plelab.errors import PlelabError


def prepare_run_data(cfg: RunConfig, progress: bool = True, dist=None):
    if cfg.visual.enabled:
        if dist is not None and dist.enabled:
            raise PlelabError("visual runs are single-process for now; run them without torchrun")
        from plelab.visual.data import prepare_visual

        return prepare_visual(cfg, log=print if progress else None)
    from plelab.data.pipeline import prepare_data

    return prepare_data(cfg, progress=progress, dist=dist)


def warm_caches(cfg: RunConfig) -> None:
    """Fill the on-disk caches a run needs (tokenizer and tokens, or the pretrained encoder) once, so
    that parallel workers do not each build them."""
    if cfg.visual.enabled:
        from plelab.visual.data import warm_encoder

        warm_encoder(cfg)
    else:
        from plelab.data.pipeline import prepare_data

        prepare_data(cfg, progress=False)


def trainer_class(cfg: RunConfig):
    if cfg.visual.enabled:
        from plelab.visual.trainer import VisualTrainer

        return VisualTrainer
    from plelab.train.trainer import Trainer

    return Trainer


def describe_data(cfg: RunConfig, data) -> str:
    if cfg.visual.enabled:
        return f"{len(data.train_caps):,} train / {len(data.val_caps):,} validation image–caption pairs"
    return f"{len(data.train):,} train / {len(data.val):,} validation tokens"
