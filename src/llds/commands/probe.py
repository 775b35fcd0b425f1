"""`llds probe`: the one-step per-question likelihood-displacement probe.

A thin adapter: the flags are `ProbeConfig`'s fields and the protocol flags; the work is
`llds.probe.one_step.probe_model`.
"""

from __future__ import annotations

import argparse

from llds.commands._protocol import add_protocol_arguments, resolve_protocol

HELP = (
    "one GRPO step per question from the same weights: did its correct responses lose likelihood?"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from llds.config.loader import add_dataclass_arguments
    from llds.probe.one_step import ProbeConfig

    add_dataclass_arguments(p, ProbeConfig, required=("model", "data", "retriever", "out"))
    add_protocol_arguments(p)


def run(args: argparse.Namespace) -> int:
    from llds.config.loader import from_dict, given_arguments
    from llds.probe.one_step import ProbeConfig, probe_model

    cfg = from_dict(ProbeConfig, given_arguments(args, ProbeConfig))
    summary, results = probe_model(cfg, resolve_protocol(args))
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
