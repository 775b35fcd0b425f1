"""The statistics of one step's optimizer updates, gathered micro-batch by micro-batch.

Losses are this process's shares of global sums (added, then scaled by the number of processes,
so that the cross-process mean of the logged rows restores the sum); fractions are weighted by
the micro-batch's share of its mini-batch's tokens and averaged over mini-batches; ratio extremes
are extremes. LLDS's gate on the batch's first update is kept apart: there pi_theta == pi_old,
and the gate measures rounding noise only.

A micro-batch's stats stay tensors until the step's `summary`: reading a GPU tensor as a Python
number waits for the device to finish everything queued, and doing so for a dozen stats of every
micro-batch, between its forward and its backward, would stall the launch queue of a host-bound
update every time (TRL, too, reads its metrics once per logging step).
"""

from __future__ import annotations

import math
from collections import Counter

import torch

from llds import metrics as keys
from llds.algo.objective import EXTRA_LOSS_PREFIX, LLDS_STATS, POLICY_STATS


class UpdateStats:
    """Accumulates the objective's stats and the gradient norms of one step's updates."""

    def __init__(self) -> None:
        self.sums: Counter[str] = Counter()
        self.extremes: dict[str, float] = {}
        self.grad_norms: list[float] = []
        self.first_mini_batches = 0
        self.pending: list[tuple[dict[str, torch.Tensor], float, bool, bool]] = []

    @property
    def updates(self) -> int:
        """Optimizer steps taken so far (skipped non-finite ones not counted)."""
        return len(self.grad_norms)

    def start_mini_batch(self) -> bool:
        """Whether the mini-batch about to be computed comes before the batch's first
        successful update (pi_theta == pi_old)."""
        first = self.updates == 0
        self.first_mini_batches += first
        return first

    def add(
        self, stats: dict[str, torch.Tensor], share: float, *, first: bool, llds_acts: bool
    ) -> None:
        """One micro-batch's objective stats; `share`: its part of the mini-batch's tokens. Kept
        as detached tensors (no host synchronisation) and added up in `summary`."""
        kept = {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in stats.items()}
        self.pending.append((kept, share, first, llds_acts))

    def _accumulate(
        self, stats: dict[str, torch.Tensor], share: float, first: bool, llds_acts: bool
    ) -> None:
        acc = self.sums
        acc[keys.PG_LOSS] += float(stats[keys.PG_LOSS])
        for key in POLICY_STATS:
            acc[f"policy/{key}"] += float(stats[f"policy/{key}"]) * share
        ratio_max = max(self.extremes.get(keys.RATIO_MAX, -1e30), float(stats[keys.RATIO_MAX]))
        self.extremes[keys.RATIO_MAX] = ratio_max
        ratio_min = min(self.extremes.get(keys.RATIO_MIN, 1e30), float(stats[keys.RATIO_MIN]))
        self.extremes[keys.RATIO_MIN] = ratio_min
        if keys.KL in stats:
            acc[keys.KL] += float(stats[keys.KL])
        for key, value in stats.items():  # extra loss terms (`algo.extra_terms`)
            if key.startswith(EXTRA_LOSS_PREFIX):  # a share of a global sum, like the losses
                acc[key] += float(value)
            elif not key.startswith(("policy/", "llds/")):  # their own statistics: token-weighted
                acc[key] += float(value) * share
        if keys.LLDS_GATE_FRAC not in stats:
            return
        if first:
            acc[keys.LLDS_FIRST_STEP_GATE_FRAC] += float(stats[keys.LLDS_GATE_FRAC]) * share
        if llds_acts:
            acc[keys.LLDS_LOSS] += float(stats[keys.LLDS_LOSS])
            for key in LLDS_STATS:
                acc[f"llds/{key}"] += float(stats[f"llds/{key}"]) * share

    def add_rest(self, loss: float, rows: int) -> None:
        """`algo.llds.scope: batch`: one mini-batch's LLDS term on the rest of the batch (this
        process's share of it) and how many responses it drew."""
        self.sums[keys.LLDS_REST_LOSS] += loss
        self.sums[keys.LLDS_REST_ROWS] += rows

    def add_update(self, grad_norm: float | None) -> None:
        """An optimizer step's gradient norm before clipping; None: skipped (non-finite)."""
        if grad_norm is not None:
            self.grad_norms.append(grad_norm)

    def summary(self, mini_batches: int, processes: int) -> dict[str, float]:
        """The step's metrics over its `mini_batches` (x epochs) mini-batches, on one of
        `processes` processes."""
        for pending in self.pending:
            self._accumulate(*pending)
        self.pending.clear()
        acc = self.sums
        out = {key: val / mini_batches for key, val in acc.items()}
        if keys.LLDS_FIRST_STEP_GATE_FRAC in acc:  # measured on one mini-batch, not averaged
            out[keys.LLDS_FIRST_STEP_GATE_FRAC] = acc[keys.LLDS_FIRST_STEP_GATE_FRAC] / max(
                1, self.first_mini_batches
            )
        sums = [k for k in out if k.startswith(EXTRA_LOSS_PREFIX)]
        for key in (keys.PG_LOSS, keys.KL, keys.LLDS_LOSS, keys.LLDS_REST_LOSS, *sums):
            if key in out:  # this rank's share of a global sum: the cross-rank mean restores it
                out[key] *= processes
        out.update(self.extremes)
        norms = self.grad_norms
        out[keys.GRAD_NORM] = sum(norms) / len(norms) if norms else math.nan
        out["policy/grad_norm_max"] = max(norms) if norms else math.nan
        out["optim/updates"] = self.updates
        return out
