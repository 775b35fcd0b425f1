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
from llds.evaluation.evaluate import evaluate
from llds.rollout import RolloutConfig
from llds.runs.eval_result import EvalResult, eval_file


def eval_metrics(result: EvalResult) -> dict[str, float]:
    """The scores as flat `eval/...` metric keys (overall, per hop count)."""
    out = {f"eval/{k}": float(v) for k, v in result.overall.to_dict().items() if k != "n"}
    for hops, scores in result.by_hops.items():
        if scores.n:
            out[f"eval/em_{hops}hop"] = scores.em
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
            result.write(eval_file(self.out_dir, step))
        return eval_metrics(result)


def eval_rollout_config(train_rollout: RolloutConfig, max_turns: int) -> RolloutConfig:
    """The training rollout limits with the evaluation's search budget, greedy, one per question."""
    return dataclasses.replace(train_rollout, max_turns=max_turns, temperature=0.0, group_size=1)
