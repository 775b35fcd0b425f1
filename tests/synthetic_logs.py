"""Synthetic metrics logs with known phase change points, for tests, docs and report demos.

Each scenario is a piecewise-linear curve plus seeded Gaussian noise, shaped after the
trajectories in the LLD paper: the change points are parameters, so a detector can be checked
against them exactly.
"""

from __future__ import annotations

import math
import random
from typing import Any, Literal

from llds import metrics as keys

Scenario = Literal["healthy", "stagnation", "steady_decay", "collapse"]
SCENARIOS: tuple[Scenario, ...] = ("healthy", "stagnation", "steady_decay", "collapse")


def synthetic_rows(
    scenario: Scenario,
    *,
    steps: int = 160,
    seed: int = 0,
    noise: float = 1.0,
    decay_start: int = 60,
    decay_slope: float = 0.006,
    collapse_start: int = 120,
    displacement: bool = False,
) -> list[dict[str, Any]]:
    """Metrics rows (as the trainer logs them) for one scenario.

    - healthy: correct-response log-likelihood rises 0.003/step, reward rises 0.004/step.
    - stagnation: likelihood flat at -0.45 while reward rises.
    - steady_decay: flat likelihood until `decay_start`, then falls `decay_slope`/step while
      reward keeps rising and grad norm stays put.
    - collapse: steady decay, then from `collapse_start` the likelihood drops sharply (0.18
      in the first step, 1.5 in all), entropy triples, grad norm x10, ratio max x8 and
      reward falls to 0 in 15 steps.
    `noise` scales every noise level (0 gives the exact piecewise-linear curves).
    With `displacement`, the rows also carry the paper's displacement of the responses GRPO
    pushes up: `lld/disp_pos` 0.25 (stagnation: 0.0) and `lld/frac_pos_fell` 0.15 while
    healthy, -0.15 and 0.7 from `decay_start` (steady decay and collapse), -2.0 and 0.95 from
    `collapse_start`.
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}")
    rng = random.Random(seed)

    def gauss(sigma: float) -> float:
        return rng.gauss(0.0, sigma * noise)

    rows: list[dict[str, Any]] = []
    for step in range(1, steps + 1):
        reward = min(0.10 + 0.004 * step, 0.65)
        logp = -0.45
        entropy, grad, ratio, fell = 0.80 - 0.001 * step, 0.50, 1.30, 0.35
        if scenario == "healthy":
            logp = min(-0.60 + 0.003 * step, -0.15)
        elif scenario in ("steady_decay", "collapse") and step > decay_start:
            logp = -0.45 - decay_slope * (step - decay_start)
            fell = 0.55
        if scenario == "collapse" and step >= collapse_start:
            k = step - collapse_start
            drop = 1.5 * (1 - math.exp(-(k + 1) / 8))  # sharp at first, then saturating
            logp = -0.45 - decay_slope * (collapse_start - decay_start) - drop
            entropy, grad, ratio, fell = 3 * entropy, 10 * grad, 8 * ratio, 0.9
            reward = max(0.0, reward * (1 - (k + 1) / 15))
        disp, pos_fell = (0.0, 0.3) if scenario == "stagnation" else (0.25, 0.15)
        if scenario in ("steady_decay", "collapse") and step > decay_start:
            disp, pos_fell = -0.15, 0.7
        if scenario == "collapse" and step >= collapse_start:
            disp, pos_fell = -2.0, 0.95
        reward = min(1.0, max(0.0, reward + gauss(0.04)))
        logp += gauss(0.015)
        extra = (
            {
                keys.DISP_POS: disp + gauss(0.1),
                keys.FRAC_POS_FELL: min(1.0, max(0.0, pos_fell + gauss(0.1))),
            }
            if displacement
            else {}
        )
        rows.append(
            {
                **extra,
                "step": step,
                keys.REWARD_MEAN: reward,
                keys.REWARD_EM: reward,
                keys.LOGP_CORRECT: logp,
                keys.LOGP_INCORRECT: logp - 0.35 + gauss(0.02),
                keys.DISP_CORRECT: 0.02 * (logp + 0.45)
                + gauss(0.01)
                + (0.01 if fell < 0.5 else -0.02),
                keys.DISP_INCORRECT: -0.05 + gauss(0.01),
                keys.FRAC_CORRECT_FELL: min(1.0, max(0.0, fell + gauss(0.05))),
                keys.ENTROPY: entropy * math.exp(gauss(0.03)),
                keys.GRAD_NORM: grad * math.exp(gauss(0.10)),
                keys.RATIO_MAX: ratio * math.exp(gauss(0.05)),
                keys.VALID_SEARCHES: max(0.0, 1.0 + 0.005 * step + gauss(0.05)),
                keys.RESPONSE_TOKENS: max(10.0, 180 + 0.3 * step + gauss(8)),
                keys.SKIPPED_TOTAL: 0,
            }
        )
    return rows
