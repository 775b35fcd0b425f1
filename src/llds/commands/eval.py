"""`llds eval`: greedy evaluation of a model on QA data with search.

A thin adapter: the flags are `EvalConfig`'s fields and the protocol flags; the work is
`llds.evaluation.evaluate.run_evaluation`.
"""

from __future__ import annotations

import argparse

from llds.commands._protocol import add_protocol_arguments, resolve_protocol

HELP = "evaluate a model (greedy) on QA data: per-source EM/F1/sub-EM and valid searches"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from llds.config.loader import add_dataclass_arguments
    from llds.evaluation.evaluate import EvalConfig

    add_dataclass_arguments(p, EvalConfig, required=("model", "data", "retriever"))
    add_protocol_arguments(p)


def run(args: argparse.Namespace) -> int:
    from llds.config.loader import from_dict, given_arguments
    from llds.evaluation.evaluate import EvalConfig, results_table, run_evaluation

    cfg = from_dict(EvalConfig, given_arguments(args, EvalConfig))
    results = run_evaluation(cfg, resolve_protocol(args))
    print(results_table(results))
    if cfg.out:
        print(f"results written to {cfg.out}")
    return 0
