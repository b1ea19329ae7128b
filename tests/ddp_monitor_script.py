"""Run by tests/test_monitor.py under torchrun (2 CPU processes, gloo): an attached model in DDP with a Monitor."""

import sys

import torch
import torch.distributed as dist
from hf_models import VOCAB, tiny_host
from torch.nn.parallel import DistributedDataParallel

import plelab

out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_flush_denormal(True)
model = DistributedDataParallel(plelab.attach(tiny_host(), 8))
opt = plelab.adamw(plelab.param_groups(model.module, lr=1e-2))
monitor = plelab.Monitor(model, out, every=2, checkpoint_every=4,
                         val_windows=torch.randint(0, VOCAB, (4, 9), generator=torch.Generator().manual_seed(9)))
for step in range(4):
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(100 * step + rank))
    model(ids, labels=ids).loss.backward()
    monitor.step(step)
    opt.step()
    opt.zero_grad()
monitor.close()
dist.barrier()  # no rank tears the group down while another is still writing (pytorch/pytorch#75097)
dist.destroy_process_group()
