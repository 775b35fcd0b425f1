"""Worker for test_train_distributed: `Dist.from_main` runs its function on rank 0 only and
every rank gets rank 0's answer; and `close_process_group` leaves no communication threads
behind, even when `torch.distributed.nn.functional` is imported after the group exists (as
loading a model with transformers does)."""

import json
import os
import sys

from llds.train.distributed import Dist, close_process_group


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


threads_before = os_threads()
dist = Dist()
import torch.distributed.nn.functional  # noqa: E402, F401

calls: list[int] = []


def answer() -> dict:
    calls.append(dist.rank)
    return {"computed_on": dist.rank, "value": [1, "two", 3.0]}


got = dist.from_main(answer)
threads_during = os_threads()
close_process_group()
with open(f"{sys.argv[1]}/from_main{dist.rank}.json", "w") as f:
    json.dump(
        {
            "got": got,
            "calls": calls,
            "threads": [threads_before, threads_during, os_threads()],
        },
        f,
    )
