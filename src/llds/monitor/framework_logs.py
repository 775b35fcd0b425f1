"""A framework's logged metrics in the monitor's names, and the monitor on them.

TRL logs `reward`, `grad_norm`, `learning_rate`; veRL `critic/score/mean`, `actor/grad_norm`,
`actor/lr`; the adapters log the project's own areas (`lld/*`, `llds/*`, `mismatch/*`,
`turns/*`) unchanged or flattened (`actor/lld_premb_n_pos`). `map_row` maps one logged record
onto the native names, so the same detectors run inside TRL's trainer
(`llds.integrations.trl`), on a veRL driver's metrics (`llds.integrations.verl.alarm_monitor`)
and, after the fact, in `llds report` and `llds monitor replay` (`llds.report.sources`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llds import metrics as keys
from llds.monitor.alarms import Alarm, AlarmMonitor
from llds.monitor.drift_alarms import LR_KEY
from llds.monitor.settings import MonitorConfig

TRL_NAMES: dict[str, str] = {
    "reward": keys.REWARD_MEAN,
    "entropy": keys.ENTROPY,
    "kl": keys.KL,
    "grad_norm": keys.GRAD_NORM,
    "completions/mean_length": keys.RESPONSE_TOKENS,
    "clip_ratio/low_mean": "policy/clip_frac_low",
    "clip_ratio/high_mean": "policy/clip_frac_high",
    "sampling/sampling_logp_difference/max": "mismatch/abs_logp_diff_max",
    "sampling/sampling_logp_difference/mean": "mismatch/abs_logp_diff_mean",
    "learning_rate": LR_KEY,
}
"""TRL 1.16's GRPO metric names -> the report's (its `sampling/*` differences between the vLLM
sampler and the trained policy are the mismatch's absolute log-prob differences)."""

VERL_NAMES: dict[str, str] = {
    "critic/score/mean": keys.REWARD_MEAN,
    "actor/entropy": keys.ENTROPY,
    "actor/grad_norm": keys.GRAD_NORM,
    "actor/ppo_kl": "policy/approx_kl",
    "actor/pg_clipfrac": "policy/clip_frac_high",
    "actor/pg_clipfrac_lower": "policy/clip_frac_low",
    "actor/kl_loss": keys.KL,
    "response_length/mean": keys.RESPONSE_TOKENS,
    "rollout_corr/k3_kl": "mismatch/k3_kl",
    "rollout_corr/chi2_token": "mismatch/chi2_token",
    "rollout_corr/rollout_is_mean": "mismatch/is_weight_mean",
    "actor/lr": LR_KEY,
}
"""veRL 0.9's metric names -> the report's. `critic/score/mean` is the task reward before any
KL penalty (`critic/rewards/mean` has it subtracted), the native `reward/mean`; its rollout
correction's `rollout_corr/*` statistics are the mismatch's."""

NATIVE_AREAS = ("reward/", "rollout/", "policy/", "optim/", "llds/", "lld/", "mismatch/", "turns/")
"""Names already in the report's form: they pass unchanged (the adapters log them so)."""


FLAT_AREAS = ("llds", "lld", "mismatch", "turns")
"""Areas the veRL loss flattens into `actor/AREA_name` (veRL's metric names take one `/`)."""


def _native_name(name: str, table: Mapping[str, str]) -> str | None:
    """The report's name of one logged metric (None: not one the report reads).

    `actor/llds_gate_frac` -> `llds/gate_frac`, `actor/mismatch_k3_kl` -> `mismatch/k3_kl` (the
    veRL loss's flattened names); `actor/lld/...`, `train/lld/...` -> `lld/...` (a framework's
    area prefix in front of one of ours)."""
    if name in table:
        return table[name]
    for prefix in ("actor/", "train/"):
        for area in FLAT_AREAS:
            if name.startswith(f"{prefix}{area}_"):
                return f"{area}/" + name.removeprefix(f"{prefix}{area}_")
        if name.startswith(prefix) and name.removeprefix(prefix).startswith(NATIVE_AREAS):
            return name.removeprefix(prefix)
    return name if name.startswith(NATIVE_AREAS) else None


def map_row(step: int, metrics: Mapping[str, Any], table: Mapping[str, str]) -> dict[str, Any]:
    """One row in the report's names: numbers only; a name logged under both its own and a
    framework's name keeps its own (the adapter's value is the one the docs define)."""
    row: dict[str, Any] = {"step": step}
    direct: set[str] = set()
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        native = _native_name(name, table)
        if native is None or native in direct:
            continue
        row[native] = value
        if native == name:
            direct.add(native)
    _premb_share(row)
    return row


def _premb_share(row: dict[str, Any]) -> None:
    """veRL's loss logs the counts of the pre-mini-batch LLD share (its per-micro-batch means
    pool correctly, a share would not): the step's share is their ratio."""
    fell, pos = row.get("lld/premb_n_pos_fell"), row.get("lld/premb_n_pos")
    if "lld/premb_share_pos_fell" not in row and fell is not None and pos:
        row["lld/premb_share_pos_fell"] = fell / pos


class LoggedMonitor:
    """The alarm monitor fed with a framework's logged records: `update(step, metrics)` maps
    the names (`names`: `TRL_NAMES`, `VERL_NAMES`) and returns the alarms newly raised."""

    def __init__(self, config: MonitorConfig | None, names: Mapping[str, str]) -> None:
        self.monitor = AlarmMonitor(config)
        self.names = names

    def update(self, step: int, metrics: Mapping[str, Any]) -> list[Alarm]:
        """A record without one metric the monitor reads (a framework's closing runtime
        summary) is not a step: it raises nothing and is not counted."""
        row = map_row(step, metrics, self.names)
        return self.monitor.update(row) if len(row) > 1 else []

    @property
    def alarms(self) -> list[Alarm]:
        return self.monitor.alarms
