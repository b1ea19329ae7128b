"""Run by tests/test_scale_out.py under torchrun (gloo): build a model sharded on the meta device and check, on
rank 0, that its gathered weights equal a single-process build bit for bit; every rank reports its share.

argv: OUT_JSON INIT_BLOCK (a small block forces the row-block draws that only large models have)."""

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

import plelab.model.init as init
from plelab.config import resolve_config
from plelab.training.parallel import fsdp_sharder

out, init.INIT_BLOCK = sys.argv[1], int(sys.argv[2])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
cfg = resolve_config("cpu-tiny", ["ple.dim=8"])
model = init.build_model(cfg.model, cfg.ple, seed=5, shard=fsdp_sharder(bf16=False))
local = torch.tensor([sum(p.to_local().numel() for p in model.parameters())])
shares = [torch.zeros_like(local) for _ in range(world)]
dist.all_gather(shares, local)
full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
if rank == 0:
    ref = init.build_model(cfg.model, cfg.ple, seed=5).state_dict()
    blocked = [k for k, v in ref.items() if init.init_block_rows(tuple(v.shape)) < v.shape[0]]
    different = [k for k in ref if not torch.equal(full[k], ref[k])]
    with open(out, "w") as f:
        json.dump({"same_names": sorted(full) == sorted(ref), "different": different, "blocked": blocked,
                   "shares": [int(s) for s in shares], "total": sum(v.numel() for v in ref.values())}, f)
dist.barrier()
dist.destroy_process_group()
