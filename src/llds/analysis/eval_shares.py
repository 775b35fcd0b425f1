"""Shares of a held-out evaluation's responses that EM alone does not show.

- `copied_share`: answers found verbatim in a passage the model retrieved for that question. Does
  the policy answer from its searches or from memory? (Added after the LLD study's `long-chains`
  runs, where held-out answers stopped following the passages.)
- `punctuation_run_share`: responses with a run of 5+ of one punctuation character
  (`Kulban)))))`), degenerate text that EM cannot see because its normalization drops
  punctuation. (Added after a `similar-names` GRPO run kept its EM while its reference chains
  lost 75 nats.) It counts what the trainer's `rollout/punct_run_frac` counts.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from llds.env.rewards import normalize_answer
from llds.env.tags import INFO_CLOSE, INFO_OPEN
from llds.monitor.degenerate import punctuation_run_frac
from llds.runs.eval_result import EvalRecord, EvalResult

_PASSAGES = re.compile(re.escape(INFO_OPEN) + "(.*?)" + re.escape(INFO_CLOSE), re.S)


def _copied(record: EvalRecord) -> bool:
    """Whether the record's answer is in its retrieved passages, normalized as EM is (case,
    punctuation, articles), on word boundaries."""
    passages = normalize_answer(" ".join(_PASSAGES.findall(record.response)))
    return f" {normalize_answer(record.prediction or '')} " in f" {passages} "


def copied_share(result: EvalResult) -> float | None:
    """Share of the answered questions whose answer appears verbatim in a passage the model
    retrieved for it (None when nothing was answered)."""
    answered = [r for r in result.records if r.prediction and normalize_answer(r.prediction)]
    if not answered:
        return None
    return sum(map(_copied, answered)) / len(answered)


def punctuation_run_share(result: EvalResult) -> float | None:
    """Share of the held-out responses that contain a run of 5+ of one punctuation character
    (None for an evaluation without records)."""
    if not result.records:
        return None
    return punctuation_run_frac([r.response for r in result.records])


EVAL_SHARES: dict[str, Callable[[EvalResult], float | None]] = {
    "copied": copied_share,
    "punctuation_runs": punctuation_run_share,
}
"""The per-evaluation shares every study run summary carries, by name."""
