"""Fixed reference chains: the starting policy's own greedy answers to held-out questions, whose
likelihood is re-read every N steps of training.

The displacement metrics (`lld/disp_pos`, ...) read the step's own batch. In the LLD study's
`long-chains` world the batch's pushed-up responses *gained* likelihood at every step while the
starting policy's correct answers to held-out questions lost it from step 10 on, and held-out
EM fell to 0; on the organism, where held-out EM rose, the same chains gained likelihood. A
fixed set of token ids has neither the batch's blind spot nor the selection bias of the
rollout-time likelihood, and unlike EM it moves continuously. Re-reading it is one no-grad
forward pass; on the organism that takes as long as a greedy evaluation of the same questions
(`benchmarks/reference_chains_cost.py`), so it adds a reading, not a saving.

The chains are built once, at step 0, and written beside the run (`REFERENCE_FILE`), so that a
resumed run measures against the same start.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llds import metrics as keys
from llds.errors import DataFormatError
from llds.io import write_json
from llds.rollout.batch import Episode, RolloutBatch

REFERENCE_FILE = "reference_chains.json"


def change_summary(start: Sequence[float], now: Sequence[float]) -> tuple[float, float]:
    """(median change, share with change <= 0) of paired summed log-likelihoods."""
    change = [b - a for a, b in zip(start, now, strict=True)]
    return statistics.median(change), sum(c <= 0 for c in change) / len(change)


def reference_metrics(
    start: Sequence[float], now: Sequence[float], correct: Sequence[bool]
) -> dict[str, float]:
    """The `lld/ref_*` metrics: for the chains that were correct and those that were wrong at
    the start, the median change of their summed log-likelihood and the share that fell.
    A side with no chains is left out (nothing to report)."""
    out: dict[str, float] = {}
    for want, change_key, fell_key in (
        (True, keys.REF_CORRECT_CHANGE, keys.REF_CORRECT_FELL),
        (False, keys.REF_WRONG_CHANGE, keys.REF_WRONG_FELL),
    ):
        rows = [i for i, c in enumerate(correct) if c == want]
        if rows:
            med, fell = change_summary([start[i] for i in rows], [now[i] for i in rows])
            out[change_key], out[fell_key] = med, fell
    return out


@dataclass
class ReferenceChains:
    """Fixed trajectories (exact token ids), whether each was correct, and the summed
    log-likelihood of its model-written tokens under the starting policy."""

    episodes: list[Episode]
    correct: list[bool]
    start: list[float]

    def batch(self, pad_id: int) -> RolloutBatch:
        return RolloutBatch.from_episodes(self.episodes, pad_id)

    def log_likelihoods(self, model, pad_id: int, token_budget: int) -> list[float]:
        """Each chain's summed log-likelihood of its model-written tokens under `model`."""
        from llds.policy.forward import batched_log_probs

        batch = self.batch(pad_id)
        logp, _ = batched_log_probs(model, batch, token_budget)
        return (logp * batch.loss_mask.float()).sum(-1).tolist()

    def metrics(self, model, pad_id: int, token_budget: int) -> dict[str, float]:
        return reference_metrics(
            self.start, self.log_likelihoods(model, pad_id, token_budget), self.correct
        )

    @classmethod
    def build(
        cls, model, engine, prompts: Sequence[tuple[list[int], Any]], pad_id: int, budget: int
    ) -> ReferenceChains:
        """Greedy trajectories of `model` through `engine` (a greedy, one-per-question rollout
        engine) for `prompts` = (prompt ids, example) pairs, and their starting likelihoods."""
        from llds.rollout import RolloutRequest

        requests = [RolloutRequest(ids, ex.id, ex.id, tuple(ex.answers)) for ids, ex in prompts]
        episodes = engine.generate(requests).episodes
        chains = cls(episodes, [bool(ep.em) for ep in episodes], [])
        chains.start = chains.log_likelihoods(model, pad_id, budget)
        return chains

    def write(self, path: str | Path) -> None:
        rows = [
            {
                "id": ep.example_id,
                "prompt_ids": ep.prompt_ids,
                "response_ids": ep.response_ids,
                "action_mask": ep.action_mask,
                "correct": c,
                "start": s,
            }
            for ep, c, s in zip(self.episodes, self.correct, self.start, strict=True)
        ]
        write_json(path, {"format": 1, "chains": rows}, indent=None)

    @classmethod
    def read(cls, path: str | Path) -> ReferenceChains:
        try:
            rows = json.loads(Path(path).read_text(encoding="utf-8"))["chains"]
            episodes = [
                Episode(
                    prompt_ids=[int(t) for t in r["prompt_ids"]],
                    example_id=str(r["id"]),
                    group_id=str(r["id"]),
                    golds=(),
                    response_ids=[int(t) for t in r["response_ids"]],
                    action_mask=[int(m) for m in r["action_mask"]],
                    answer_mask=[0] * len(r["response_ids"]),
                    logprobs=None,
                    entropies=None,
                )
                for r in rows
            ]
            correct = [bool(r["correct"]) for r in rows]
            start = [float(r["start"]) for r in rows]
        except (KeyError, TypeError, ValueError) as exc:  # JSONDecodeError is a ValueError
            raise DataFormatError(f"{path}: not a reference-chains file ({exc!r})") from exc
        if not episodes or any(len(e.response_ids) != len(e.action_mask) for e in episodes):
            raise DataFormatError(f"{path}: no chains, or a response and its mask differ in length")
        return cls(episodes, correct, start)
