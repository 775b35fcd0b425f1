"""`llds eval`: greedy evaluation of a model on QA data with search.

A thin adapter: the keys are `EvalConfig`'s fields (the protocol's under `protocol.`); the work
is `llds.evaluation.evaluate.run_evaluation`. `model` may be a LoRA checkpoint: its adapter is
put on the base it was trained on (checked) and merged.
"""

from __future__ import annotations

import argparse
from typing import Any

HELP = "evaluate a model (greedy) on QA data: per-source EM/F1/sub-EM and valid searches"
ALIASES = {"--model": "model", "--data": "data", "--retriever": "retriever", "--out": "out"}
OUTPUT_FILES = ("out",)
"""files this command writes: never one of its inputs"""


CONFIG = "llds.evaluation.config:EvalConfig"


def run(cfg: Any, args: argparse.Namespace) -> int:
    import dataclasses

    from llds.evaluation.evaluate import results_table, run_evaluation
    from llds.policy.lora import adapter_dir_of

    adapter = adapter_dir_of(cfg.model)  # a LoRA checkpoint (or its adapter/): on its base
    if adapter is not None:  # run_evaluation checks the base, with the other inputs
        cfg = dataclasses.replace(cfg, model=str(adapter))  # the protocol is saved beside it
    protocol, source = cfg.protocol.resolve(cfg.model)
    results = run_evaluation(cfg, protocol)
    # after the work, so that an input refused on the way is the only line printed
    print(f"protocol from {source}, overrides applied: {protocol}")
    print(results_table(results))
    if cfg.out:
        print(f"results written to {cfg.out}")
    return 0
