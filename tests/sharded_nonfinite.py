"""Under torchrun, 2 processes: an infinity in one element of a sharded gradient, which only the
rank holding that element's shard sees, makes the non-finite check false on every rank. Prints
every rank's answer, from rank 0, as one JSON line."""

from __future__ import annotations

import json

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from trainer.distributed.world import exit_process
from trainer.training.phases import gradients_finite

dist.init_process_group("gloo")
model = nn.Linear(4, 4)
fully_shard(model)
model(torch.ones(2, 4)).sum().backward()
before = gradients_finite(list(model.parameters()))
if dist.get_rank() == 0:  # rank 0's shard of the weight's gradient: one element
    model.weight.grad.to_local()[0, 0] = float("inf")
after = gradients_finite(list(model.parameters()))
answers = [None, None]
dist.all_gather_object(answers, {"before": before, "after": after})
if dist.get_rank() == 0:
    print(json.dumps(answers), flush=True)
dist.barrier()
exit_process(0)  # gloo's threads would abort the interpreter's finalization (see there)
