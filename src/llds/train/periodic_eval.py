"""Held-out evaluation during training: greedy EM every `eval_every` steps, into the metrics.

Training reward is measured on sampled rollouts of training questions; what a user wants to see
is whether the greedy policy answers unseen questions better. The evaluation is greedy, draws no
random numbers and restores the model's train/eval mode, so turning it on does not change the
training trajectory (a resumed run stays identical to an uninterrupted one).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llds.data.example import QAExample
from llds.env.prompts import PromptTemplate
from llds.io import write_json
from llds.rollout import RolloutConfig
from llds.train.evaluate import evaluate

EVAL_DIR = "eval"


def eval_file(run_dir: str | Path, step: int) -> Path:
    """Where an evaluation of a run's model after `step` steps is kept: `RUN/eval/step_N.json`.

    The one convention for every evaluation (periodic ones during training, the demo's final
    ones, a warm start's at step 0), so `llds report` finds held-out EM for any run."""
    return Path(run_dir) / EVAL_DIR / f"step_{step:06d}.json"


def latest_eval_file(run_dir: str | Path) -> Path | None:
    """The evaluation of the highest step kept for a run, or None."""
    files = sorted((Path(run_dir) / EVAL_DIR).glob("step_*.json"))
    return files[-1] if files else None


def eval_metrics(result: dict[str, Any]) -> dict[str, float]:
    """`evaluate()`'s aggregates as flat `eval/...` metric keys (overall, per hop count)."""
    overall = result["overall"]
    out = {f"eval/{k}": float(v) for k, v in overall.items() if k != "n"}
    for hops, agg in result.get("by_hops", {}).items():
        if agg.get("n"):
            out[f"eval/em_{hops}hop"] = float(agg["em"])
    return out


def is_due(step: int, every: int, last_step: int) -> bool:
    """Evaluate every `every` steps and after the last one; `every <= 0` turns it off."""
    return every > 0 and (step % every == 0 or step == last_step)


@dataclasses.dataclass
class PeriodicEvaluator:
    """Evaluates a model on fixed held-out examples; each result is also kept as JSON."""

    examples: Sequence[QAExample]
    retriever: Any
    tokenizer: Any
    rollout: RolloutConfig
    template: PromptTemplate | str | None = None
    chat: bool | None = None
    out_dir: Path | None = None

    def __call__(self, model: Any, step: int) -> dict[str, float]:
        was_training = model.training
        model.eval()
        try:
            result = evaluate(
                model,
                self.tokenizer,
                self.retriever,
                self.examples,
                self.rollout,
                template=self.template,
                chat=self.chat,
                progress=False,
            )
        finally:
            model.train(was_training)
        if self.out_dir is not None:
            write_json(eval_file(self.out_dir, step), result)
        return eval_metrics(result)


def eval_rollout_config(train_rollout: RolloutConfig, max_turns: int) -> RolloutConfig:
    """The training rollout limits with the evaluation's search budget, greedy, one per question."""
    return dataclasses.replace(train_rollout, max_turns=max_turns, temperature=0.0, group_size=1)
