"""The LLD study's definitions: its arms, seed sets and factors, and how a run of one is
configured, started and probed. Every driver of this folder reads them from here.

Each arm is an override file of one recipe (`experiments/lld_study/*.yaml`, `base.yaml` on the
`organism` preset); every run starts from a warm start (`DEMO/sft/model`, its world in
`DEMO/world`). Protocol: experiments/lld_study/PROTOCOL.md.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import finished, run_unfinished
from llds.analysis.study_logs import arm_dir_name
from llds.runs.eval_result import EvalResult, eval_file
from llds.train.config import TrainConfig, load_config

HERE = Path(__file__).resolve().parent
ARMS: dict[str, str] = {
    "GRPO": "grpo.yaml",
    "GRPO+LLDS": "grpo-llds.yaml",
    # the variants, run where GRPO showed LLD (each changes one thing against GRPO+LLDS)
    "GRPO+LLDS-MA": "grpo-llds-ma.yaml",
    "GRPO+LLDS-lam0.1": "grpo-llds-lam0.1.yaml",
    "GRPO+LLDS-lam0.01": "grpo-llds-lam0.01.yaml",
    "GRPO+LLDS-token": "grpo-llds-token.yaml",
    "GRPO+LLDS-response": "grpo-llds-response.yaml",
}
MAIN_ARMS = ["GRPO", "GRPO+LLDS"]
SEED_SETS: dict[str, tuple[int, ...]] = {"tune": (10, 11, 12), "judge": (0, 1, 2)}
COLORS = {
    "GRPO": "tab:red",
    "GRPO+LLDS": "tab:blue",
    "GRPO+LLDS-MA": "tab:green",
    "GRPO+LLDS-lam0.1": "tab:purple",
    "GRPO+LLDS-lam0.01": "tab:pink",
    "GRPO+LLDS-token": "tab:olive",
    "GRPO+LLDS-response": "tab:cyan",
}


@dataclass(frozen=True)
class Factor:
    """One of the theorem's factors: what changes against the organism's world (`WorldConfig`
    keys) and warm start (`SFTConfig` keys of the `sft-demo` preset); GRPO is the same recipe."""

    why: str
    world: dict[str, Any] = field(default_factory=dict)
    sft: dict[str, Any] = field(default_factory=dict)


FACTORS: dict[str, Factor] = {
    "similar-names": Factor(
        "half of the names are near-duplicates of another (one syllable changed), and names are "
        "sub-word pieces, not one token each: right and wrong answers share most of their tokens",
        world={"name_similarity": 0.5},
        sft={"name_tokens": False},
    ),
    "long-chains": Factor(
        "80% of the questions need 2-3 searches (organism: 50%): correct and incorrect responses "
        "share their first searches and the passages those return",
        world={"hop_mix": {1: 0.2, 2: 0.4, 3: 0.4}},
    ),
    "larger-model": Factor(
        "a 6.2M-parameter model (hidden 256, 6 layers; organism: 0.6M, 128 x 2)",
        sft={"hidden": 256, "layers": 6},
    ),
}
WARM_START_EM = (0.15, 0.75)  # pre-registered range of a usable warm start's held-out EM
PROBE_QUESTIONS = 64  # training questions sampled by the end-of-run probe (mixed groups kept)


def build_warm_start(name: str, root: Path, sft_steps: int | None = None) -> Path:
    """The factor's world and warm start (the demo's recipe with the factor's changes), and its
    held-out EM, in `root/warm`; what is already there is kept. Returns that folder."""
    from llds.data.world import WorldConfig, generate_world, write_world
    from llds.demo import TEMPLATE, evaluate_model
    from llds.sft import load_sft_config
    from llds.sft import run as run_sft

    factor, warm = FACTORS[name], root / "warm"
    print(f"{name}: {factor.why}", flush=True)
    if not (warm / "world" / "train.jsonl").is_file():
        write_world(generate_world(WorldConfig.preset("organism", **factor.world)), warm / "world")
    (warm / "prompt.txt").write_text(TEMPLATE, encoding="utf-8")
    if not (warm / "sft" / "model").is_dir():
        given = {
            "world": str(warm / "world"),
            "out": str(warm / "sft"),
            "prompt_template": str(warm / "prompt.txt"),
            "seed": 0,
            "threads": 1,
            "progress": False,
            **factor.sft,
        }
        if sft_steps is not None:
            given["steps"] = sft_steps
        t0 = time.perf_counter()
        run_sft(load_sft_config("sft-demo", given))
        print(f"{name}: warm start trained in {time.perf_counter() - t0:.0f} s", flush=True)
    start = eval_file(warm / "sft", 0)
    if not start.is_file():
        evaluate_model(warm / "sft" / "model", warm, start, 120)
    res = EvalResult.read(start)
    lo, hi = WARM_START_EM
    verdict = "usable" if lo <= res.overall.em <= hi else f"outside [{lo}, {hi}]"
    print(f"{name}: warm start held-out EM {res.overall.em:.3f} ({verdict})", flush=True)
    return warm


def run_dir(out: Path, arm: str, seed: int) -> Path:
    """Where the run of `arm` for `seed` lives: `OUT/GRPO_LLDS/seed0`."""
    return out / arm_dir_name(arm) / f"seed{seed}"


def arm_config(
    demo: Path, out: Path, arm: str, seed: int, extra: Sequence[str] = ()
) -> TrainConfig:
    """The run of `arm` for `seed`: the arm's file plus the warm start's paths and the seed
    (and `extra` overrides, for measurements that rerun part of a study run)."""
    return load_config(
        HERE / ARMS[arm],
        [
            f"run_dir={run_dir(out, arm, seed)}",
            f"seed={seed}",
            f"model.path={demo / 'sft' / 'model'}",
            f"data.train={demo / 'world' / 'train.jsonl'}",
            f"data.eval={demo / 'world' / 'test.jsonl'}",
            f"retriever.source={demo / 'world' / 'corpus.jsonl'}",
            *extra,
        ],
    )


def select_seeds(seed_set: str, wanted: Sequence[int] | None) -> tuple[int, ...]:
    """The set's seeds, or the wanted ones among them in the set's order (a typo fails loudly:
    a seed outside the set would be a run no protocol named)."""
    seeds = SEED_SETS[seed_set]
    if not wanted:
        return seeds
    if not set(wanted) <= set(seeds):
        raise ValueError(f"--seeds {list(wanted)}: the {seed_set} set has seeds {list(seeds)}")
    return tuple(s for s in seeds if s in wanted)


def run_all(
    demo: Path, out: Path, arms: Sequence[str], seeds: Sequence[int], parallel: int
) -> None:
    """Every unfinished (arm, seed) in its own process, `parallel` at a time."""
    run_unfinished([arm_config(demo, out, arm, s) for s in seeds for arm in arms], parallel)


def probe_final(model_dir: Path, demo: Path, out: Path) -> dict[str, Any]:
    """The one-step probe (Eq. 3) on `model_dir` over the first PROBE_QUESTIONS training
    questions, 8 rollouts each; cached in `out/probe.json`."""
    cached = out / "probe.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    from llds.probe.one_step import ProbeConfig, probe_model

    cfg = ProbeConfig(
        model=str(model_dir),
        data=[str(demo / "world" / "train.jsonl")],
        retriever=str(demo / "world" / "corpus.jsonl"),
        out=str(out),
        limit=PROBE_QUESTIONS,
    )
    summary, _ = probe_model(cfg)
    return summary


def probe_all(demo: Path, out: Path, arms: Sequence[str], seeds: Sequence[int]) -> None:
    """The end-of-run probe of every finished run, and of the warm start they all began from."""
    probe_final(demo / "sft" / "model", demo, out / "warm_start_probe")
    for arm in arms:
        for seed in seeds:
            cfg = arm_config(demo, out, arm, seed)
            if finished(cfg):
                last = Path(cfg.run_dir) / "checkpoints" / f"step_{cfg.steps:06d}" / "model"
                probe_final(last, demo, Path(cfg.run_dir) / "probe_final")
