"""Worker for test_train_distributed: the retriever stops answering on rank 1 only, in a run
started the way `llds train` starts one (`llds.train.run`). Both ranks must stop with the
retriever's message and leave the process group cleanly (exit status 0 here, not an abort);
rank 0 must not go on into the update's collectives with a rank that left."""

import json
import os
import sys

from llds.errors import ServiceUnavailableError
from llds.retrieval.client import RetrievalServiceError
from llds.rollout.engine import RolloutEngine
from llds.train import run
from llds.train.config import load_config

config, run_dir = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
if rank == 1:

    def retriever_down(*args, **kwargs):
        raise RetrievalServiceError(None, "connection refused")

    RolloutEngine.generate = retriever_down
try:
    run(load_config(config, [f"run_dir={run_dir}"]))
    outcome = "trained"
except ServiceUnavailableError as exc:
    outcome = str(exc)
with open(f"{run_dir}/outcome{rank}.json", "w") as f:
    json.dump({"rank": rank, "outcome": outcome}, f)
