"""The SmolLM2 trivia-wiki study's pre-registered question (experiments/smollm2_wiki/PROTOCOL.md):
does GRPO's median test EM at the fixed step beat the warm start's by more than one standard
error and by at least 0.05?

Computed from what the runs wrote (their evaluation files), so a reader recomputes it from the
committed logs, and a table printed while runs are going says which have reached the step.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping
from pathlib import Path

from llds.runs.eval_result import EvalResult, eval_files

TEST, TRANSFER = "held-out", "transfer"
MIN_GAIN = 0.05
"""The protocol's smallest gain that counts as a yes (absolute test EM)."""


@dataclasses.dataclass(frozen=True)
class RunScore:
    """One run's test and transfer EM at its evaluation of `step` (NaN when absent)."""

    arm: str
    seed: int
    step: int
    test: float
    transfer: float


def binomial_se(p: float, n: int) -> float:
    """One standard error of an EM measured as a share of `n` questions at rate `p`."""
    return math.sqrt(p * (1 - p) / n) if n > 0 else math.nan


def _em(res: EvalResult, source: str) -> tuple[float, int]:
    scores = res.by_source.get(source)
    return (scores.em, scores.n) if scores is not None and scores.n else (math.nan, 0)


def scores_at(runs: Mapping[tuple[str, int], Path], step: int) -> list[RunScore]:
    """Each run's EM at its evaluation of `step`; a run that has not reached it is left out."""
    out = []
    for (arm, seed), run in runs.items():
        found = dict(eval_files(run))
        if step in found:
            res = EvalResult.read(found[step])
            out.append(RunScore(arm, seed, step, _em(res, TEST)[0], _em(res, TRANSFER)[0]))
    return out


def study_answer(
    runs: Mapping[tuple[str, int], Path], start: Path, step: int, seeds: int = 3
) -> str:
    """The protocol's table and answer at `step` (markdown): per arm, every seed's test and
    transfer EM, their medians, and the gain over the warm start against one binomial standard
    error of the warm start's test EM. The answer is given only when every one of `seeds`
    seeds of GRPO has been evaluated at `step`."""
    if not start.is_file():
        return "(the warm start has not been evaluated yet)"
    warm_test, n = _em(EvalResult.read(start), TEST)
    warm_transfer, n_transfer = _em(EvalResult.read(start), TRANSFER)
    se = binomial_se(warm_test, n)
    lines = [
        f"Warm start: test EM {warm_test:.3f} ({n} questions; one standard error "
        f"{se:.3f}), transfer EM {warm_transfer:.3f} ({n_transfer} questions).",
        "",
        f"| arm | seeds evaluated at step {step} | test EM per seed | median | minus warm start "
        "| transfer EM per seed | median |",
        "|---|---|---|---|---|---|---|",
    ]
    scored = scores_at(runs, step)
    by_arm: dict[str, list[RunScore]] = {}
    for s in scored:
        by_arm.setdefault(s.arm, []).append(s)
    medians = {}
    for arm in dict.fromkeys(a for a, _ in runs):
        got = sorted(by_arm.get(arm, []), key=lambda s: s.seed)
        if not got:
            lines.append(f"| {arm} | 0 | - | - | - | - | - |")
            continue
        test = statistics.median(s.test for s in got)
        transfer = statistics.median(s.transfer for s in got)
        medians[arm] = (len(got), test)
        lines.append(
            f"| {arm} | {len(got)} | "
            + ", ".join(f"{s.test:.3f} (seed {s.seed})" for s in got)
            + f" | {test:.3f} | {test - warm_test:+.3f} | "
            + ", ".join(f"{s.transfer:.3f}" for s in got)
            + f" | {transfer:.3f} |"
        )
    count, grpo = medians.get("GRPO", (0, math.nan))
    if count < seeds:
        verdict = f"Not answered yet: {count} of {seeds} GRPO seeds evaluated at step {step}."
    else:
        gain = grpo - warm_test
        yes = gain > se and gain >= MIN_GAIN
        verdict = (
            f"GRPO's median test EM minus the warm start's: {gain:+.3f} (one standard error "
            f"{se:.3f}; at least {MIN_GAIN:.2f} needed): **{'yes' if yes else 'no'}**."
        )
    return "\n".join([*lines, "", verdict])
