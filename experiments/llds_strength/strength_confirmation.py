"""The LLDS-strength study's confirmation (`experiments/llds_strength/CONFIRMATION.md`): GRPO
against the lambda the dose-response picked, 300 steps, judged by the theorem study's
definitions. Pure functions of the runs' logged rows, so a test can check them by hand."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from llds.analysis.significance import (
    exact_permutation_p,
    fisher_p,
    smallest_fisher_p,
    smallest_permutation_p,
)
from llds.analysis.study_logs import COMMITTED_LOG, read_committed_metrics
from llds.monitor import searches as search_rule
from llds_strength.strength_study import DOSE_ARMS, WARM_EM
from theorem_world import theorem_study

Rows = Sequence[Mapping[str, Any]]

STEPS = theorem_study.STEPS  # 300
SEEDS = (1, 2, 3, 4, 5, 6)
BASE_ARM = "lam0"
EM_SD = 0.25
"""The seed-to-seed spread of held-out EM in the theorem study, which the power is stated at."""
Z_SUM = float(stats.norm.ppf(0.975) + stats.norm.ppf(0.8))
"""z for a two-sided 5% test plus z for 80% power (about 2.80)."""
DIFFERENCE_P = 0.05


def arm_for(lam: float) -> str:
    """The dose arm run at `lam` (`lam0.6` for 0.6)."""
    for arm, value in DOSE_ARMS.items():
        if math.isclose(value, lam):
            return arm
    raise ValueError(f"no dose arm runs lambda {lam:g} (arms: {', '.join(DOSE_ARMS)})")


def detectable_gap(n: int, sd: float = EM_SD) -> float:
    """The EM gap that n seeds per arm detect with 80% power at two-sided 5%, for seed SD `sd`
    (normal approximation: (z_0.975 + z_0.8) * sd * sqrt(2 / n))."""
    return Z_SUM * sd * math.sqrt(2 / n)


def confirmation_summary(
    runs: Mapping[str, Mapping[int, Rows]],
    llds_arm: str,
    warm_em: float | None = WARM_EM,
    part: str = "",
) -> dict[str, Any]:
    """Every run's numbers, both arms over their complete seeds and the protocol's three answers,
    as `{"json": ..., "markdown": ...}`. `runs` is `{arm: {seed: rows}}` for `lam0` and
    `llds_arm`; partial runs are listed and kept out of the answers. `warm_em` is the step-0
    held-out EM of the warm start the runs started from (None where unmeasured); `part` names
    which part of the confirmation they are (CONFIRMATION.md, amendment 1) in the heading."""
    names = {BASE_ARM: "grpo", llds_arm: "grpo-llds"}  # the theorem study's arm names
    per_run = {
        arm: {s: theorem_study.run_summary(rows, warm_em) for s, rows in sorted(by.items())}
        for arm, by in runs.items()
    }
    done = {arm: {s: r["steps"] >= STEPS for s, r in by.items()} for arm, by in per_run.items()}
    per_arm = {arm: theorem_study.arm_over_seeds(per_run[arm], done[arm]) for arm in per_run}
    complete = {
        names[a]: {s: r for s, r in per_run[a].items() if done[a][s]} for a in per_run if a in names
    }
    verdict = theorem_study.answers(
        complete, {a: dict.fromkeys(by, True) for a, by in complete.items()}
    )
    grpo_done = len(complete.get("grpo", {}))
    if 0 < grpo_done < 2:
        # the rule needs LLD in 2 GRPO runs: with one complete run it cannot yet say "no"
        lld = sum(bool(r["lld"]) for r in complete["grpo"].values())
        verdict = {
            **verdict,
            "lld_under_grpo": f"pending: LLD in {lld} of {grpo_done} complete grpo run; "
            "the rule asks for LLD in at least 2",
            "llds": "pending",
        }
    base, llds = per_arm.get(BASE_ARM), per_arm.get(llds_arm)
    em_base = [v for v in (base or {}).get("em_300", []) if v is not None]
    em_llds = [v for v in (llds or {}).get("em_300", []) if v is not None]
    n = min(len(em_base), len(em_llds))
    collapsed = {
        arm: sum(c is not None for c in a["collapses"]) for arm, a in per_arm.items() if a["seeds"]
    }
    answers: dict[str, Any] = {
        "prevention": verdict["llds"],
        "lld_under_grpo": verdict["lld_under_grpo"],
        "conditions": verdict.get("conditions"),
        "em_difference": (float(np.mean(em_llds) - np.mean(em_base)) if n else None),
        "em_permutation_p": exact_permutation_p(em_llds, em_base),
        "collapsed": collapsed,
        "collapse_fisher_p": fisher_p(
            collapsed.get(llds_arm, 0),
            len((llds or {}).get("seeds", [])),
            collapsed.get(BASE_ARM, 0),
            len((base or {}).get("seeds", [])),
        ),
        "complete_seeds": {BASE_ARM: len(em_base), llds_arm: len(em_llds)},
        "detectable_gap": detectable_gap(n) if n else None,
        # what the exact tests can give at these seeds, whatever the data: below 0.05 or not
        "smallest_p": {
            "em_permutation": smallest_permutation_p(len(em_llds), len(em_base)),
            "collapse_fisher": smallest_fisher_p(
                len((llds or {}).get("seeds", [])), len((base or {}).get("seeds", []))
            ),
        },
        # the seed-to-seed spread this confirmation measured, beside the assumed EM_SD
        "em_sd": {
            BASE_ARM: statistics.stdev(em_base) if len(em_base) > 1 else None,
            llds_arm: statistics.stdev(em_llds) if len(em_llds) > 1 else None,
        },
    }
    p = answers["em_permutation_p"]
    answers["em_verdict"] = (
        "pending" if p is None else "a difference" if p < DIFFERENCE_P else "no difference detected"
    )
    data = {"llds_arm": llds_arm, "part": part, "warm_em": warm_em, "runs": per_run}
    data.update({"complete": done, "per_arm": per_arm, "answers": answers})
    markdown = _markdown(per_run, done, per_arm, answers, llds_arm, part)
    return {"json": data, "markdown": markdown}


def condition_lines(conditions: Mapping[str, Sequence[Any]] | None, llds_arm: str) -> list[str]:
    """The prevention rule's three conditions as sentences, each with the figures it compared
    (the JSON keeps the raw `[holds, figures...]` lists)."""
    if not conditions:
        return []
    lines = []
    for name, (holds, *figures) in conditions.items():
        verdict = "yes" if holds else "no"
        if name == "lld_in_at_most_one_run":
            lines.append(f"LLD in at most one {llds_arm} run: {verdict} (LLD in {figures[0]})")
        elif name == "pooled_share_at_most_half":
            arm, base = figures
            half = None if base is None else theorem_study.LLDS_SHARE_RATIO * base
            lines.append(
                f"pooled share at most half of {BASE_ARM}'s: {verdict} ({_fmt(arm)} against "
                f"{_fmt(half)}, half of {_fmt(base)})"
            )
        elif name.startswith("em_at_"):
            arm, base = figures
            lines.append(
                f"held-out EM at {STEPS} not below {BASE_ARM}'s by more than "
                f"{theorem_study.LLDS_EM_MARGIN:g}: {verdict} ({_fmt(arm)} against {_fmt(base)})"
            )
        else:
            raise ValueError(f"unknown prevention condition {name!r}")
    return lines


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _seeds_per_arm(n: int) -> str:
    return "1 seed per arm detects" if n == 1 else f"{n} seeds per arm detect"


def _collapse_counts(collapsed: Mapping[str, int], per_arm: Mapping[str, Mapping[str, Any]]) -> str:
    """'lam0 2 of 3, lam0.6 0 of 3': collapsed runs over complete seeds, per arm."""
    return ", ".join(f"{arm} {n} of {len(per_arm[arm]['seeds'])}" for arm, n in collapsed.items())


def _markdown(
    per_run: Mapping[str, Mapping[int, Mapping[str, Any]]],
    done: Mapping[str, Mapping[int, bool]],
    per_arm: Mapping[str, Mapping[str, Any]],
    answers: Mapping[str, Any],
    llds_arm: str,
    part: str = "",
) -> str:
    title = "LLDS-strength confirmation" + (f", {part}" if part else "")
    md = [f"# {title}: {BASE_ARM} against {llds_arm}, {STEPS} steps", ""]
    md += [
        "| arm | seed | steps | collapse | pooled share fell before any fall (fell/positive) "
        "| LLD rule 1 (window) | LLD rule 2 (probe step) | search decline (step) "
        "| valid searches, first -> last window | held-out EM at 25, 50, ... |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, by_seed in per_run.items():
        for seed, r in by_seed.items():
            pooled = r["pooled_before_fall"]["all"]
            share = pooled["fell"] / pooled["responses"] if pooled["responses"] else None
            steps = f"{r['steps']}" + ("" if done[arm][seed] else " (partial)")
            ems = ", ".join(f"{v:.3f}" for s, v in sorted(r["em"].items()) if s > 0) or "-"
            searches = [v for v in r["searches_by_window"] if v is not None]
            trend = f"{searches[0]:.2f} -> {searches[-1]:.2f}" if searches else "-"
            md.append(
                f"| {arm} | {seed} | {steps} | {r['collapse'] or '-'} "
                f"| {_fmt(share)} ({pooled['fell']}/{pooled['responses']}) "
                f"| {r['lld_window'] or '-'} | {r['lld_probe_step'] or '-'} "
                f"| {r['search_decline_step'] or '-'} | {trend} | {ems} |"
            )
    md += [
        "",
        "`search decline`: the first step of the monitor's `search_decline` warning (the "
        f"{search_rule.WINDOW}-step median of valid searches per rollout at or below "
        f"{search_rule.SEARCH_DECLINE:g} of its median over the run's first {search_rule.EARLY} "
        f"steps); `valid searches`: the means of the first and the last {theorem_study.WINDOW}"
        "-step window. The theorem study asked whether LLDS searches less, CONFIRMATION.md does "
        "not: these are measurements beside the answers, not among them.",
        "",
        "## Per arm (complete runs only)",
        "",
        "Each cell: every seed's value in seed order; their median; their mean ± one standard "
        "error (sample s.d. / sqrt(seeds)).",
        "",
        f"| arm | seeds | pooled share fell before any fall | held-out EM at {STEPS} | collapse |",
        "|---|---|---|---|---|",
    ]
    for arm, a in per_arm.items():
        collapses = " / ".join(str(c) if c else "none" for c in a["collapses"]) or "-"
        md.append(
            f"| {arm} | {', '.join(map(str, a['seeds'])) or '-'} "
            f"| {theorem_study.spread_md(a['share'], a['share_spread'])} "
            f"| {theorem_study.spread_md(a['em_300'], a['em_spread'])} | {collapses} |"
        )
    seeds = answers["complete_seeds"]
    gap = answers["detectable_gap"]
    md += [
        "",
        "## Answers (CONFIRMATION.md; complete runs only)",
        "",
        f"Complete seeds: {seeds[BASE_ARM]} of {BASE_ARM}, {seeds[llds_arm]} of {llds_arm}.",
        "",
        f"1. **Prevention** (the theorem study's rule): {answers['prevention']}; LLD under GRPO: "
        f"{answers['lld_under_grpo']}",
    ]
    md += [f"   - {line}" for line in condition_lines(answers["conditions"], llds_arm)]
    md += [
        f"2. **Held-out EM at {STEPS}**: {answers['em_verdict']} (mean {llds_arm} - {BASE_ARM} "
        f"{_fmt(answers['em_difference'], '+.3f')}, exact permutation p "
        f"{_fmt(answers['em_permutation_p'])})",
        f"3. **Collapses**: {_collapse_counts(answers['collapsed'], per_arm) or '-'} "
        "(Fisher's exact p "
        f"{_fmt(answers['collapse_fisher_p'])})",
        "",
        "Power: " + _power_line(gap, answers, seeds),
    ]
    return "\n".join(md) + "\n"


def _power_line(gap: float | None, answers: Mapping[str, Any], seeds: Mapping[str, int]) -> str:
    """What the complete seeds can detect: the normal approximation's gap at 80% power, unless the
    exact test cannot give a p below DIFFERENCE_P at these seeds whatever the data (below 4 + 4
    seeds), which the approximation does not see; then that, with the smallest p it can give."""
    if gap is None:
        return "no complete pair of seeds yet."
    measured = (
        f"Seed SD of the EM at {STEPS} measured here: "
        + ", ".join(f"{arm} {_fmt(sd)}" for arm, sd in answers["em_sd"].items())
        + "."
    )
    smallest = answers["smallest_p"]
    counts = " + ".join(str(n) for n in seeds.values())
    fisher = smallest["collapse_fisher"]
    fisher_note = (
        f" Nor can Fisher's test on the collapses (smallest possible p {fisher:.3f})."
        if fisher is not None and fisher >= DIFFERENCE_P
        else ""
    )
    em_floor = smallest["em_permutation"]
    if em_floor is not None and em_floor >= DIFFERENCE_P:
        return (
            f"with {counts} complete seeds no EM gap, however large, can be called a difference: "
            f"the exact permutation test cannot give a p below {DIFFERENCE_P:g} there whatever "
            f"the data (smallest possible p {em_floor:.3f}); the normal approximation's gap at "
            f"80% power ({gap:.2f} at seed SD {EM_SD}) applies only where it can."
            + fisher_note
            + f" {measured}"
        )
    return (
        f"{_seeds_per_arm(min(seeds.values()))} an EM gap of about {gap:.2f} at 80% (two-sided "
        f"5%, seed SD {EM_SD}); smaller gaps can go undetected.{fisher_note} {measured}"
    )


def load_logs(root: Path, llds_arm: str) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """`{arm: {seed: rows}}` from `root/ARM/seedN/metrics.jsonl.gz` for `lam0` and `llds_arm`,
    every seed found (6 or more)."""
    out: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for arm in (BASE_ARM, llds_arm):
        for folder in sorted((root / arm).glob("seed*"), key=lambda p: int(p.name[4:])):
            path = folder / COMMITTED_LOG
            if path.is_file():
                out.setdefault(arm, {})[int(folder.name[4:])] = read_committed_metrics(path)
    return out
