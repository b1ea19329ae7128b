"""Wrapping a model for torchrun: DDP, or FSDP2 with one unit per decoder layer (the process group itself is
:mod:`plelab.distributed`)."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from plelab.distributed import DistInfo
from plelab.errors import PlelabError


def wrap_model(model: nn.Module, mode: str, info: DistInfo, device: torch.device,
               bf16: bool, ignore: tuple[str, ...] | list[str] = ()) -> nn.Module:
    """DDP, or FSDP2 with one unit per decoder layer, one for the PLE table and one for the root.

    FSDP2 shards parameters in place (``model`` itself becomes the sharded module) and
    the return value is ``model``; DDP returns a wrapper whose ``.module`` is ``model``.
    DDP neither broadcasts nor reduces the parameters named in ``ignore`` (the row-sparse table,
    whose gradient the trainer averages itself: NCCL has no sparse all-reduce).
    """
    if not info.enabled:
        return model
    if mode == "ddp":
        if ignore:
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, list(ignore))
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if mode == "fsdp":
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16
              else MixedPrecisionPolicy())
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=mp)
        if hasattr(model.model, "embed_tokens_per_layer"):
            fully_shard(model.model.embed_tokens_per_layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        return model
    raise PlelabError(f"invalid config value train.parallel={mode!r}: allowed ddp | fsdp")
