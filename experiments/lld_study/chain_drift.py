"""Where did the held-out answers go? The likelihood of fixed held-out chains along a run.

The batch's displacement metrics (`lld/disp_pos`, ...) only see the rollouts of the batch. When
held-out EM falls while the batch's pushed-up responses gain likelihood, they cannot say whether
the updates took likelihood from correct chains that no batch contained. These functions read
that from the warm start's own held-out trajectories (fixed token ids), re-read under later
checkpoints: the change of each chain's summed log-likelihood, split by action, and the readings
and alarm the LLD study fixed before its runs (experiments/lld_study/PROTOCOL.md).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from llds.algo.segments import action_segments
from llds.runs.tracking import read_metrics

PARTS = ("total", "first", "later_searches", "answer")
"""How a chain's log-likelihood is split: all of it, its first action, the actions between the
first and the last, and its last action (the answer) when it has more than one."""
_CLOCK = ("time/", "throughput/")
"""Metric keys that differ between two runs of the same code and seed only by wall clock."""


def chain_parts(token_logp: torch.Tensor, loss_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per trajectory, the summed log-likelihood of its model-written tokens: in total, in its
    first action, in the actions between the first and the last (its later searches), and in
    its last action (the answer) when it has more than one action. `[B, T]` in, `[B]` each."""
    index, count = action_segments(loss_mask)
    last = (count - 1).clamp(min=0).unsqueeze(1)
    written = index >= 0
    first = index == 0
    answer = written & (index == last) & (index > 0)
    middle = written & ~first & ~answer
    lp = token_logp.float()
    return {
        "total": (lp * written).sum(-1),
        "first": (lp * first).sum(-1),
        "later_searches": (lp * middle).sum(-1),
        "answer": (lp * answer).sum(-1),
    }


def drift_summary(before: Sequence[float], after: Sequence[float]) -> dict[str, Any]:
    """Median change and share that fell (change <= 0) of paired log-likelihoods."""
    change = [b - a for a, b in zip(before, after, strict=True)]
    if not change:
        return {"median": None, "fell": None, "n": 0}
    fell = sum(c <= 0 for c in change) / len(change)
    return {"median": statistics.median(change), "fell": fell, "n": len(change)}


def reading(correct: dict[str, Any]) -> str:
    """The protocol's reading of the correct chains' change: displaced / overtaken / mixed."""
    med, fell = correct["median"], correct["fell"]
    if med is None:
        return "-"
    if med < 0 and fell > 0.5:
        return "displaced"
    if med >= 0:
        return "overtaken"
    return "mixed"


def reference_alarm(rows: Sequence[dict[str, Any]], in_a_row: int = 2) -> int | None:
    """The pre-registered reference-chain alarm: the step of the `in_a_row`-th reading in a row
    whose correct chains' median change is below 0 with more than half of them fallen."""
    run = 0
    for r in rows:
        c = r["correct/total"]
        falling = c["median"] is not None and c["median"] < 0 and c["fell"] > 0.5
        run = run + 1 if falling else 0
        if run >= in_a_row:
            return r["step"]
    return None


def compare_with_study(rerun: Path, study: Path, steps: int) -> dict[str, Any]:
    """Row-by-row comparison of a rerun's metrics with the study run's over the first `steps`
    steps: the largest absolute difference over every numeric key except the wall clock."""
    a = {r["step"]: r for r in read_metrics(rerun) if r["step"] <= steps}
    b = {r["step"]: r for r in read_metrics(study) if r["step"] <= steps}
    worst, where = 0.0, None
    for step in sorted(set(a) & set(b)):
        for key, va in a[step].items():
            vb = b[step].get(key)
            if key.startswith(_CLOCK) or not isinstance(va, (int, float)):
                continue
            if not isinstance(vb, (int, float)):
                continue
            if math.isnan(va) and math.isnan(vb):
                continue
            d = abs(va - vb)
            if d > worst or math.isnan(d):
                worst, where = d, f"{key} @ {step}"
    return {"rows": len(set(a) & set(b)), "max_abs_diff": worst, "where": where}


def rows_of(
    start: dict[str, Any], result: dict[str, Any], correct: Sequence[bool]
) -> list[dict[str, Any]]:
    """One row per checkpoint of `result` (its `checkpoints`: step -> `parts`, `em`,
    `valid_searches`): EM, searches, and the drift of correct / wrong chains against `start`."""
    rows = []
    for step, m in sorted(result["checkpoints"].items(), key=lambda kv: int(kv[0])):
        row: dict[str, Any] = {"step": int(step), "em": m["em"], "searches": m["valid_searches"]}
        for label, want in (("correct", True), ("wrong", False)):
            for part in PARTS:
                a = [x for x, c in zip(start["parts"][part], correct, strict=True) if c == want]
                b = [x for x, c in zip(m["parts"][part], correct, strict=True) if c == want]
                row[f"{label}/{part}"] = drift_summary(a, b)
        rows.append(row)
    return rows
