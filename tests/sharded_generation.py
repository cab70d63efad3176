"""Under torchrun, 2 processes: the text task's sampling from a generator sharded with FSDP2,
rank 0's texts ending at their first token and rank 1's running to ``max_new_tokens``. Each
forward all-gathers the generator's shards, so every rank must run as many forwards as the
longest generation of any rank. Prints every rank's text lengths, from rank 0, as one JSON line."""

from __future__ import annotations

import copy
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from trainer.contract.config import load_config
from trainer.contract.registry import load_task
from trainer.distributed.world import exit_process

dist.init_process_group("gloo")
rank = dist.get_rank()
task = load_task(load_config(config=sys.argv[1]))
generator = task.build_generator()
whole = copy.deepcopy(generator)
for block in generator.transformer.h:
    fully_shard(block)
fully_shard(generator)
num, new = 4, task.options.max_new_tokens
with torch.no_grad():
    scores = generator(input_ids=torch.full((num, 1), task.start_id)).logits[:, -1].float()
scores[:, task.banned] = -float("inf")
cdf = scores.softmax(-1).cumsum(-1) / scores.softmax(-1).sum(-1, keepdim=True)
below = cdf[:, task.eos_id - 1] if task.eos_id else torch.zeros(num)
uniforms = torch.full((num, new), 0.5)
if rank == 0:  # inside the end token's share of the first draw: every text ends there
    uniforms[:, 0] = (below + cdf[:, task.eos_id]) / 2
with torch.no_grad():
    tokens = task.sample_sequences(generator, torch.empty((num, 0), dtype=torch.long), uniforms)
    expected = task.sample_sequences(whole, torch.empty((num, 0), dtype=torch.long), uniforms)
# gloo pairs collectives by their order alone: a rank that ran fewer forwards leaves the others'
# all-gathers paired with its later collectives (garbage weights, no error) and this one off
ranks = [torch.zeros(1, dtype=torch.long) for _ in range(2)]
dist.all_gather(ranks, torch.tensor([rank]))
result = {"lengths": task.lengths(tokens).tolist(), "as_unsharded": torch.equal(tokens, expected)}
results = [None, None]
dist.all_gather_object(results, {**result, "ranks": torch.cat(ranks).tolist()})
if rank == 0:
    print(json.dumps(results), flush=True)
dist.barrier()
exit_process(0)  # gloo's threads would abort the interpreter's finalization (see there)
