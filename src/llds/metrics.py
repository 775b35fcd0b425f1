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
LLDS_REST_LOSS = "llds/rest_loss"
"""`algo.llds.scope: batch`: the LLDS term on the rest of the batch, mean per mini-batch"""
LLDS_REST_ROWS = "llds/rest_rows"
"""`algo.llds.scope: batch`: responses drawn from the rest of the batch, mean per mini-batch"""
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
# LLD as pooled shares of responses (and actions) whose summed log-likelihood fell in the update;
# each share comes with the count it is over, so shares pool across steps and processes
SHARE_POS_FELL = "lld/share_pos_fell"
SHARE_POS_FELL_ACC_LO = "lld/share_pos_fell_acc_lo"
SHARE_POS_FELL_ACC_HI = "lld/share_pos_fell_acc_hi"
SHARE_POS_FELL_FIRST_ACTION = "lld/share_pos_fell_first_action"
SHARE_POS_FELL_LATER_ACTIONS = "lld/share_pos_fell_later_actions"
N_POS = "lld/n_pos"
N_POS_ACC_LO = "lld/n_pos_acc_lo"
N_POS_ACC_HI = "lld/n_pos_acc_hi"
N_POS_LATER_ACTIONS = "lld/n_pos_later_actions"
SHARE_COUNTS: dict[str, str] = {
    SHARE_POS_FELL: N_POS,
    SHARE_POS_FELL_ACC_LO: N_POS_ACC_LO,
    SHARE_POS_FELL_ACC_HI: N_POS_ACC_HI,
    SHARE_POS_FELL_FIRST_ACTION: N_POS,  # every positive response has a first action
    SHARE_POS_FELL_LATER_ACTIONS: N_POS_LATER_ACTIONS,
}
"""each pooled share and the count of responses (or actions) it is a share of"""
MINIBATCH_SHARE_PREFIX = "lld/minibatch/"
"""`diagnostics.share_by_minibatch`: `lld/minibatch/share_pos_fell_kNN` and its count
`lld/minibatch/n_pos_kNN`, NN the 1-based index of the response's mini-batch in the update"""


def minibatch_share_keys(part: int) -> tuple[str, str]:
    """The share and count keys of the 0-based mini-batch index `part`."""
    tag = f"k{part + 1:02d}"
    return (
        f"{MINIBATCH_SHARE_PREFIX}share_pos_fell_{tag}",
        f"{MINIBATCH_SHARE_PREFIX}n_pos_{tag}",
    )


# mismatch between the sampling policy and the trained one (`llds.monitor.mismatch`)
MISMATCH_K3_KL = "mismatch/k3_kl"
MISMATCH_ABS_LOGP_DIFF_MAX = "mismatch/abs_logp_diff_max"
MISMATCH_ABS_LOGP_DIFF_MEAN = "mismatch/abs_logp_diff_mean"
MISMATCH_CHI2_TOKEN = "mismatch/chi2_token"
MISMATCH_IS_ESS = "mismatch/is_ess"
MISMATCH_IS_WEIGHT_MEAN = "mismatch/is_weight_mean"
MISMATCH_IS_CLIPPED_FRAC = "mismatch/is_clipped_frac"
# turns (`llds.monitor.turns`)
TURNS_PER_ROLLOUT = "turns/per_rollout"
TURNS_VOID_SHARE = "turns/void_share"
TURNS_VALID_SEARCH_SHARE = "turns/valid_search_share"
TURNS_FILTERED_SHARE = "turns/filtered_share"

Reduction = Literal["mean", "max", "min", "same"]

_BY_NAME: dict[str, Reduction] = {
    CONTEXT_CAPPED: "same",  # already a count over the global batch on every rank
    # the trainer pools these over processes itself (counts summed, shares weighted by their
    # counts: `llds.monitor.likelihood.pool_shares`), so every rank holds the global value
    **{name: "same" for pair in SHARE_COUNTS.items() for name in pair},
}


def reduction_of(name: str) -> Reduction:
    """How a metric is combined over processes: `*_max` / `*_min` by max / min; timings and
    optimizer counters by max (the slowest rank; counters are equal on every rank); values that
    every rank already holds for the global batch are taken as they are; everything else is the
    mean weighted by each rank's number of rollouts."""
    if name in _BY_NAME:
        return _BY_NAME[name]
    if name.startswith(MINIBATCH_SHARE_PREFIX):  # pooled over processes by the trainer
        return "same"
    if name.endswith("_max") or name.startswith(("time/", "optim/")):
        return "max"
    if name.endswith("_min"):
        return "min"
    return "mean"
