"""torchrun support: process-group set-up, DDP / FSDP2 wrapping, collective helpers.

``torchrun --nproc_per_node=N -m plelab train ...`` sets ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK``; everything else is read from them here. Backend: NCCL on CUDA, gloo on CPU
(so that CI tests the same code with 2 CPU processes).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from plelab.errors import PlelabError


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device_kind: str) -> DistInfo:
    """Join the torchrun process group if there is one (no-op for a single process)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    info = DistInfo(rank=int(os.environ["RANK"]), world_size=world, local_rank=int(os.environ.get("LOCAL_RANK", 0)),
                    local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    if not dist.is_initialized():
        if device_kind == "cuda":
            torch.cuda.set_device(info.local_rank)
        dist.init_process_group(backend="nccl" if device_kind == "cuda" else "gloo")
    return info


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def all_ranks_ok(ok: bool, info: DistInfo) -> bool:
    """True on every rank iff ``ok`` is true on every rank (so that an error on rank 0 stops all)."""
    if not info.enabled:
        return ok
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)  # NCCL reduces CUDA tensors only
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def sum_across_ranks(value: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """All-reduce sum (a copy; identity for one process)."""
    value = value.detach().clone()
    if info.enabled:
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def mean_across_ranks(value: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """All-reduce average of a scalar tensor (identity for one process)."""
    if info.enabled:
        value = value.detach().clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= info.world_size
    return value


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
        from torch.nn.parallel import DistributedDataParallel

        if ignore:
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, list(ignore))
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if mode == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16
              else MixedPrecisionPolicy())
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=mp)
        if hasattr(model.model, "embed_tokens_per_layer"):
            fully_shard(model.model.embed_tokens_per_layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        return model
    raise PlelabError(f"invalid config value train.parallel={mode!r}: allowed ddp | fsdp")


def shutdown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()
