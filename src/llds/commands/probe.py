"""`llds probe`: the one-step per-question likelihood-displacement probe.

A thin adapter: the keys are `ProbeConfig`'s fields (the protocol's under `protocol.`); the work
is `llds.probe.one_step.probe_model`.
"""

from __future__ import annotations

import argparse
from typing import Any

HELP = (
    "one GRPO step per question from the same weights: did its correct responses lose likelihood?"
)
ALIASES = {"--model": "model", "--data": "data", "--retriever": "retriever", "--out": "out"}
OUTPUT_DIRS = ("out",)
"""directories this command writes: refused up front when they exist as files"""
OUTPUT_OWNS = ("probe.json",)
"""what an earlier output of this command holds: such a folder may be written again"""


CONFIG = "llds.probe.config:ProbeConfig"


def run(cfg: Any, args: argparse.Namespace) -> int:
    import dataclasses

    from llds.evaluation.evaluate import check_model
    from llds.policy.lora import adapter_dir_of

    adapter = adapter_dir_of(cfg.model) if cfg.model != "smollm2" else None
    if adapter is not None:  # a LoRA checkpoint (or its adapter/): probed on its base, merged
        cfg = dataclasses.replace(cfg, model=str(adapter))  # the protocol is saved beside it
    protocol, source = cfg.protocol.resolve(cfg.model)
    check_model(cfg.model, chat=protocol.chat)  # the directory, or the adapter's recorded base
    from llds.data.loaders import load_many
    from llds.probe.config import probed_questions
    from llds.retrieval.factory import open_answering_retriever

    examples = load_many(cfg.data, limit=cfg.limit)  # the user's files, before torch
    only = None
    if cfg.questions_from:  # an earlier probe's questions, checked to sample as this one
        only = probed_questions(cfg.questions_from, cfg, dataclasses.asdict(protocol))
    retriever = open_answering_retriever(cfg.retriever)
    from llds.probe.one_step import probe_model  # torch: after every input's check

    summary, results = probe_model(cfg, protocol, examples=examples, retriever=retriever, only=only)
    # after the work, so that an input refused on the way is the only line printed
    print(f"protocol from {source}, overrides applied: {protocol}")
    if results:
        print(
            f"probed {summary['probed']} questions with mixed groups; "
            f"LLD (correct likelihood fell) in {summary['lld_share']:.0%} of them; to first "
            f"order in {summary['first_order_lld_share']:.0%} (median drag of the wrong "
            f"responses / pull of the right ones: {summary['median_drag_to_pull']:.2f})"
        )
    else:
        print("no question had both correct and incorrect rollouts: nothing to probe")
    print(f"written to {cfg.out}/probe.json" + (" and probe.png" if results else ""))
    return 0
