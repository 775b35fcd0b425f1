"""`llds eval`: greedy evaluation of a model on QA data with search.

A thin adapter: the keys are `EvalConfig`'s fields (the protocol's under `protocol.`); the work
is `llds.evaluation.evaluate.run_evaluation`.
"""

from __future__ import annotations

import argparse
from typing import Any

HELP = "evaluate a model (greedy) on QA data: per-source EM/F1/sub-EM and valid searches"
ALIASES = {"--model": "model", "--data": "data", "--retriever": "retriever", "--out": "out"}


CONFIG = "llds.evaluation.evaluate:EvalConfig"


def run(cfg: Any, args: argparse.Namespace) -> int:
    from llds.evaluation.evaluate import results_table, run_evaluation
    from llds.models.hf import check_model_source

    check_model_source("model", cfg.model)
    protocol, source = cfg.protocol.resolve(cfg.model)
    results = run_evaluation(cfg, protocol)
    # after the work, so that an input refused on the way is the only line printed
    print(f"protocol from {source}, overrides applied: {protocol}")
    print(results_table(results))
    if cfg.out:
        print(f"results written to {cfg.out}")
    return 0
