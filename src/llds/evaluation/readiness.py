"""Is a warm start ready for GRPO? Greedy skill, how it fails, and whether sampling varies.

GRPO learns only from groups whose rollouts differ in reward. A warm start that is always
right or always wrong on a question at temperature 1 gives that question no gradient, and one
whose wrong answers repeat the question's entity is rewarded for nothing it read. So beside
greedy EM this reports, on the same questions:

- `copy_share`: answered questions whose answer appears in the question (whole words after
  SQuAD normalization): the model named the question's entity instead of reading;
- `searches`: valid searches per question (greedy);
- `sampled_em`: EM of `samples` rollouts per question at the rollout temperature (1 by
  default), `mixed_share`: questions whose samples are neither all right nor all wrong (the
  groups GRPO learns from), `entropy`: the sampling entropy per model-written token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llds.data.example import QAExample
from llds.data.trivia_wiki import found_answers
from llds.env.prompts import PromptTemplate, build_prompt_ids
from llds.rollout import RolloutConfig, RolloutEngine, RolloutRequest


@dataclass(frozen=True)
class Readiness:
    """What `readiness` measured (means over questions unless said otherwise)."""

    questions: int
    em: float
    answered: float
    copy_share: float
    """of the answered questions"""
    searches: float
    samples: int
    sampled_em: float
    mixed_share: float
    entropy: float
    """nats per model-written token, pooled over every sampled rollout"""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def copies_question(answer: str | None, question: str) -> bool:
    """Whether an answer is (whole words of) the question itself."""
    return bool(answer) and bool(found_answers([answer], question))


def readiness(
    model: Any,
    tokenizer: Any,
    retriever: Any,
    examples: Sequence[QAExample],
    rollout: RolloutConfig,
    *,
    samples: int = 4,
    seed: int = 0,
    template: PromptTemplate | str | None = None,
    chat: bool | None = None,
) -> Readiness:
    """Greedy and sampled rollouts of `examples` (see the module docstring)."""
    if not examples or samples < 2:
        raise ValueError("readiness needs questions and at least 2 samples per question")
    prompts = [build_prompt_ids(tokenizer, ex.question, template, chat=chat) for ex in examples]
    greedy_cfg = dataclasses.replace(rollout, temperature=0.0, group_size=1)
    greedy = RolloutEngine(model, tokenizer, retriever, greedy_cfg).generate(
        [
            RolloutRequest(p, ex.id, ex.id, ex.answers)
            for p, ex in zip(prompts, examples, strict=True)
        ]
    )
    answered = [
        (ep, ex)
        for ep, ex in zip(greedy.episodes, examples, strict=True)
        if ep.stop_reason == "answer" and ep.answer
    ]
    sample_cfg = dataclasses.replace(rollout, group_size=samples)
    requests = [
        RolloutRequest(
            p, ex.id, f"{ex.id}@{j}", ex.answers, seed=seed * 1_000_003 + i * samples + j
        )
        for i, (p, ex) in enumerate(zip(prompts, examples, strict=True))
        for j in range(samples)
    ]
    sampled = RolloutEngine(model, tokenizer, retriever, sample_cfg).generate(requests).episodes
    ems = [ep.em for ep in sampled]
    per_question = [ems[i * samples : (i + 1) * samples] for i in range(len(examples))]
    written = [
        (h, m) for ep in sampled for h, m in zip(ep.entropies or [], ep.action_mask, strict=False)
    ]
    n = len(examples)
    return Readiness(
        questions=n,
        em=sum(ep.em for ep in greedy.episodes) / n,
        answered=len(answered) / n,
        copy_share=(
            sum(copies_question(ep.answer, ex.question) for ep, ex in answered) / len(answered)
            if answered
            else float("nan")
        ),
        searches=sum(ep.num_valid_searches for ep in greedy.episodes) / n,
        samples=samples,
        sampled_em=sum(ems) / len(ems),
        mixed_share=sum(0 < sum(q) < samples for q in per_question) / n,
        entropy=sum(h for h, m in written if m) / max(1, sum(m for _, m in written)),
    )
