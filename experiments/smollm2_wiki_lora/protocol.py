"""The study's fixed design (PROTOCOL.md) in one place, so that the decisions, the tables
and the driver read the same figures: the preset, the stages, the arms and seeds and their
order, the keys the rules read from a run's log, where a run's committed log lies, and how a
number is shown in a table."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llds.analysis.study_logs import COMMITTED_LOG, arm_dir_name, read_committed_metrics

PRESET = "smollm2-wiki-lora"
STEP0 = "step0"
"""Each stage's step-0 evaluation (every run of a stage starts from the same model: the LoRA
adapters start at zero, so rank, learning rate and LLDS do not change it)."""
PILOT_SEED = 100
PILOT_RANK, SMALL_RANK = 16, 4
PILOT_LRS = {"lr2e-5": 2e-5, "lr5e-5": 5e-5, "lr1e-4": 1e-4}
"""The pilot's rank-16 arms, in the protocol's order (increasing rate: ties go to the lower)."""
RANK_ARM = "r4"
GRPO, LLDS = "GRPO", "GRPO+LLDS"
STUDY_ARMS = {GRPO: ("algo.llds.enabled=false",), LLDS: ("algo.llds.enabled=true",)}
SEEDS = (0, 1, 2)
K3_KEY = "mismatch/k3_kl"
PHASES = ("rollout", "old_logprob", "ref_logprob", "update", "diagnostics", "step")


@dataclasses.dataclass(frozen=True)
class Stage:
    """A stage's length and how often it evaluates (the rules read the evaluations at every
    `eval_every` steps, not step 0)."""

    name: str
    steps: int
    eval_every: int

    @property
    def eval_steps(self) -> list[int]:
        return list(range(self.eval_every, self.steps + 1, self.eval_every))


STAGES = {"pilot": Stage("pilot", 30, 10), "study": Stage("study", 120, 40)}
SMOKE_STAGES = {"pilot": Stage("pilot", 2, 1), "study": Stage("study", 2, 1)}


def ordered(stage: str, arms: Sequence[str] | None, seeds: Sequence[int] | None):
    """The protocol's order: the pilot's three rates, then r4; the study's seed 0 of both
    arms, then seed 1, then seed 2 (a study stopped early stays balanced)."""
    if stage == "pilot":
        runs = [(a, PILOT_SEED) for a in [*PILOT_LRS, RANK_ARM]]
    else:
        runs = [(a, s) for s in SEEDS for a in STUDY_ARMS]
    return [(a, s) for a, s in runs if (not arms or a in arms) and (not seeds or s in seeds)]


def stage_rows(results: Path, stage: str, arm: str, seed: int) -> list[dict[str, Any]]:
    """A run's committed log rows ([] when none is committed)."""
    path = results / "runs" / stage / arm_dir_name(arm) / f"seed{seed}" / COMMITTED_LOG
    return read_committed_metrics(path) if path.is_file() else []


def cell(x: Any, fmt: str) -> str:
    """A number as a table cell (`-` for anything else)."""
    return "-" if not isinstance(x, int | float) or isinstance(x, bool) else format(x, fmt)
