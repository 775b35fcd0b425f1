"""Metric names and how each is reduced across processes: the interface between the trainer
(which writes `metrics.jsonl`) and the detector, alarms, plots and report (which read it).

Names are `area/name`. Keep them stable: runs on disk and users' dashboards refer to them.
"""

from __future__ import annotations

from typing import Literal

# reward and rollouts
REWARD_MEAN = "reward/mean"
REWARD_EM = "reward/em"
VALID_SEARCHES = "rollout/valid_searches"
RESPONSE_TOKENS = "rollout/response_tokens"
CONTEXT_CAPPED = "rollout/context_capped"
PUNCT_RUN_FRAC = "rollout/punct_run_frac"
# the policy update
PG_LOSS = "policy/pg_loss"
KL = "policy/kl"
ENTROPY = "policy/entropy"
GRAD_NORM = "policy/grad_norm"
RATIO_MAX = "policy/ratio_max"
RATIO_MIN = "policy/ratio_min"
UPDATE_RATIO = "optim/update_ratio"
SKIPPED_TOTAL = "optim/skipped_total"
# LLDS
LLDS_LOSS = "llds/loss"
LLDS_GATE_FRAC = "llds/gate_frac"
LLDS_FIRST_STEP_GATE_FRAC = "llds/first_step_gate_frac"
# lazy likelihood displacement
LOGP_CORRECT = "lld/logp_correct"
LOGP_INCORRECT = "lld/logp_incorrect"
DISP_CORRECT = "lld/disp_correct"
DISP_INCORRECT = "lld/disp_incorrect"
FRAC_CORRECT_FELL = "lld/frac_correct_fell"
# the paper's quantities (Def. 4.1 / Eq. 2): responses with advantage > 0 (pos) and < 0 (neg)
DISP_POS = "lld/disp_pos"
FRAC_POS_FELL = "lld/frac_pos_fell"
DISP_POS_FIRST_ACTION = "lld/disp_pos_first_action"
DISP_POS_LATER_ACTIONS = "lld/disp_pos_later_actions"
DISP_NEG = "lld/disp_neg"
HIDDEN_COSINE = "lld/hidden_cos_correct_incorrect"
OBS_MATCH = "lld/shared_first_search_wrong_frac"
# fixed reference chains (the starting policy's greedy held-out answers; `diagnostics.reference`)
REF_CORRECT_CHANGE = "lld/ref_correct_change"
REF_CORRECT_FELL = "lld/ref_correct_fell"
REF_WRONG_CHANGE = "lld/ref_wrong_change"
REF_WRONG_FELL = "lld/ref_wrong_fell"

Reduction = Literal["mean", "max", "min", "same"]

_BY_NAME: dict[str, Reduction] = {
    CONTEXT_CAPPED: "same",  # already a count over the global batch on every rank
}


def reduction_of(name: str) -> Reduction:
    """How a metric is combined over processes: `*_max` / `*_min` by max / min; timings and
    optimizer counters by max (the slowest rank; counters are equal on every rank); values that
    every rank already holds for the global batch are taken as they are; everything else is the
    mean weighted by each rank's number of rollouts."""
    if name in _BY_NAME:
        return _BY_NAME[name]
    if name.endswith("_max") or name.startswith(("time/", "optim/")):
        return "max"
    if name.endswith("_min"):
        return "min"
    return "mean"
