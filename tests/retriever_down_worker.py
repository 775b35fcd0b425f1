"""Worker for test_train_distributed: the retriever stops answering on rank 1 only. Both ranks
must stop with the retriever's message; rank 0 must not go on into the update's collectives
with a rank that left."""

import json
import sys

import torch.distributed as td

from llds.errors import ServiceUnavailableError
from llds.retrieval.client import RetrievalServiceError
from llds.train.config import load_config
from llds.train.trainer import GRPOTrainer

config, run_dir = sys.argv[1], sys.argv[2]
trainer = GRPOTrainer(load_config(config, [f"run_dir={run_dir}"]))
if trainer.dist.rank == 1:

    def retriever_down(*args, **kwargs):
        raise RetrievalServiceError(None, "connection refused")

    trainer.engine.generate = retriever_down
try:
    trainer.train(progress=False)
    outcome = "trained"
except ServiceUnavailableError as exc:
    outcome = str(exc)
with open(f"{run_dir}/outcome{trainer.dist.rank}.json", "w") as f:
    json.dump({"rank": trainer.dist.rank, "outcome": outcome}, f)
td.destroy_process_group()  # a clean exit: gloo threads alive at interpreter exit can abort it
