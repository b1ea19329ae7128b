"""torchrun support: process-group set-up and collective helpers (shared by the data pipeline and the trainer;
the DDP / FSDP2 wrapping of a model is :mod:`plelab.training.parallel`).

``torchrun --nproc_per_node=N -m plelab train ...`` sets ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK``; everything else is read from them here. Backend: NCCL on CUDA, gloo on CPU
(so that CI tests the same code with 2 CPU processes).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


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


def launch_rank() -> int:
    """This process's rank as the launcher set it (``RANK`` under torchrun with ``WORLD_SIZE`` > 1, else 0), known
    before the process group is joined."""
    try:
        return int(os.environ["RANK"]) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else 0
    except (KeyError, ValueError):
        return 0


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


def shutdown(info: DistInfo, ok: bool = True) -> None:
    """Destroy the process group at the end of a run. After a run that ended well every rank meets at a barrier
    first, so that no rank tears the group down while another is still finishing (``destroy_process_group`` is
    known to hang now and then when ranks arrive apart: pytorch/pytorch#75097). After an error there is no barrier:
    the other ranks may never arrive."""
    if info.enabled and dist.is_initialized():
        if ok:
            dist.barrier()
        dist.destroy_process_group()
