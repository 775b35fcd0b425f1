"""Worker for test_train_distributed: `Dist.from_main` runs its function on rank 0 only and
every rank gets rank 0's answer."""

import json
import sys

import torch.distributed as td

from llds.train.distributed import Dist

dist = Dist()
calls: list[int] = []


def answer() -> dict:
    calls.append(dist.rank)
    return {"computed_on": dist.rank, "value": [1, "two", 3.0]}


got = dist.from_main(answer)
with open(f"{sys.argv[1]}/from_main{dist.rank}.json", "w") as f:
    json.dump({"got": got, "calls": calls}, f)
dist.barrier()
td.destroy_process_group()
