"""Worker for test_train_distributed: LLDS-MA's beta computed on 2 ranks with different batches.

Rank 0's rollouts searched 4 times each, rank 1's never: the global mean is 2 valid searches
per rollout, so beta = min(2 / 2, 1) = 1 on both ranks (per rank it would be 1 and 0).
"""

import json
import sys
from types import SimpleNamespace

from llds.algo import LLDSConfig
from llds.train.distributed import Dist, close_process_group
from llds.train.global_batch import global_mean_searches

dist = Dist()
searches = 4 if dist.rank == 0 else 0
batch = SimpleNamespace(episodes=[SimpleNamespace(num_valid_searches=searches) for _ in range(3)])
settings = LLDSConfig(mask_answer=True, answer_baseline=2.0)
beta = settings.answer_weight_for(global_mean_searches(batch, dist))
with open(f"{sys.argv[1]}/beta{dist.rank}.json", "w") as f:
    json.dump({"rank": dist.rank, "world": dist.world, "beta": beta}, f)
close_process_group()
