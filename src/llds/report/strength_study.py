"""The LLDS-strength study (`experiments/llds_strength/PROTOCOL.md`): its arms and, from the
runs' per-step logs, its tables and the pre-registered answers."""

from __future__ import annotations

ARMS: dict[str, list[str]] = {
    "lam0": [],
    "lam0.2": ["algo.llds.enabled=true", "algo.llds.coef=0.2"],
    "lam0.6": ["algo.llds.enabled=true", "algo.llds.coef=0.6"],
    "lam2": ["algo.llds.enabled=true", "algo.llds.coef=2"],
    "lam6": ["algo.llds.enabled=true", "algo.llds.coef=6"],
    "mb1-lam0": ["optim.mini_batches=1"],
    "batch-lam0.2": [
        "algo.llds.enabled=true",
        "algo.llds.coef=0.2",
        "algo.llds.scope=batch",
        "algo.llds.batch_rows=32",
    ],
}
"""each arm's overrides of the study's base.yaml (which has LLDS off)"""
DOSE_ARMS: dict[str, float] = {"lam0": 0.0, "lam0.2": 0.2, "lam0.6": 0.6, "lam2": 2.0, "lam6": 6.0}
SEEDS = (1, 2, 3)
STEPS = 50
WARM_EM = 0.75
"""the warm start's step-0 held-out EM in the theorem study (its results/study.json)"""
