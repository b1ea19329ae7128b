"""Wrapping a model for torchrun: DDP, or FSDP2 with one unit per decoder layer (the process group itself is
:mod:`plelab.distributed`).

FSDP2 is applied on the meta device (:func:`fsdp_sharder`, passed to the model's builder), before anything is
allocated: each rank materialises and initialises only its own shard, so a rank's memory is about 1/world of the
model's from the start (``plelab.model.init``)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from plelab.distributed import DistInfo
from plelab.errors import PlelabError


def fsdp_sharder(bf16: bool) -> Callable[[nn.Module], None]:
    """FSDP2 units: one per decoder layer, one for the PLE table (when there is one) and one for the root.

    Returns a function that shards a model in place; called on a meta-device model it shards before
    materialisation (what :func:`plelab.model.init.build_model` does with ``shard=``).
    """
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16
          else MixedPrecisionPolicy())

    def shard(model: nn.Module) -> None:
        lm = getattr(model, "model", None)
        if lm is None or not hasattr(lm, "layers"):
            raise PlelabError("train.parallel=fsdp shards plelab's text models (model.layers); this model has none")
        for layer in lm.layers:
            fully_shard(layer, mp_policy=mp)
        if hasattr(lm, "embed_tokens_per_layer"):
            fully_shard(lm.embed_tokens_per_layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
    return shard


def wrap_model(model: nn.Module, mode: str, info: DistInfo, device: torch.device,
               ignore: tuple[str, ...] | list[str] = ()) -> nn.Module:
    """DDP around ``model`` (its return value's ``.module`` is ``model``); a model FSDP2 sharded when it was built
    (:func:`fsdp_sharder`) is returned as it is. One process: ``model`` itself.

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
        if not isinstance(model, FSDPModule):
            raise PlelabError("train.parallel=fsdp: the model was not sharded when it was built; build it with "
                              "shard=fsdp_sharder(...)")
        return model
    raise PlelabError(f"invalid config value train.parallel={mode!r}: allowed ddp | fsdp")
