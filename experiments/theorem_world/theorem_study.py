"""The theorem-world study's tables and its pre-registered answers
(`experiments/theorem_world/PROTOCOL.md`, where it is called `tables.py`, its first home), from
the runs' logged rows alone: pure functions of the rows, so a test can check them by hand.

Shares are pooled over responses (responses that fell over responses, steps together), never a
median of per-step shares; every share comes with its counts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from llds import metrics as keys
from llds.analysis.pooled import step_counts
from llds.analysis.seeds import median_over_seeds, seed_spread, spread_md
from llds.monitor.alarms import scan_alarms
from llds.monitor.searches import SEARCHES_KEY
from llds.report.collapse import collapse_step

Rows = Sequence[Mapping[str, Any]]

STEPS = 300
WINDOW = 25
KL_TARGET, KL_BAND = 1e-3, (3e-4, 3e-3)
WINDOW_SHARE_RULE = 0.40  # a window's pooled share above this: LLD (rule 1)
PROBE_MIN_GROUPS, PROBE_SHARE_RULE = 5, 0.10  # rule 2: >= 10% of >= 5 high-accuracy groups
LLDS_SHARE_RATIO, LLDS_EM_MARGIN = 0.5, 0.05
APPROX_KL = "policy/approx_kl"


def _num(row: Mapping[str, Any], key: str) -> float | None:
    v = row.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


_median = median_over_seeds  # the median of the known values, or None


# --- calibration ------------------------------------------------------------------------------


def _log_distance(value: float | None) -> float:
    """Distance from the target on a log scale (a median <= 0 is infinitely far below)."""
    if value is None or value <= 0:
        return math.inf
    return abs(math.log(value / KL_TARGET))


def calibration_summary(rows_by_rate: Mapping[float, Sequence[Rows]]) -> dict[str, Any]:
    """Per rate, the median over both seeds' steps of `policy/approx_kl`; the rate whose median
    is closest to 1e-3 on a log scale when one lies in [3e-4, 3e-3], else where the grid goes
    next (x3 above the largest rate when every median is below the band, /3 below the smallest
    when every one is above)."""
    table: dict[str, Any] = {}
    for lr in sorted(rows_by_rate):
        per_seed = [[_num(r, APPROX_KL) for r in rows] for rows in rows_by_rate[lr]]
        table[f"{lr:g}"] = {
            "lr": lr,
            "median": _median([v for seed in per_seed for v in seed]),
            "per_seed": [_median(seed) for seed in per_seed],
            "steps": [sum(v is not None for v in seed) for seed in per_seed],
        }
    lo, hi = KL_BAND
    inside = [t for t in table.values() if t["median"] is not None and lo <= t["median"] <= hi]
    chosen = min(inside, key=lambda t: _log_distance(t["median"]))["lr"] if inside else None
    extend_to = None
    if chosen is None:
        medians = [t["median"] for t in table.values()]
        rates = [t["lr"] for t in table.values()]
        if all(m is None or m < lo for m in medians):
            extend_to = max(rates) * 3
        elif all(m is not None and m > hi for m in medians):
            extend_to = min(rates) / 3
    rows = [
        "| learning rate | median approx-KL (both seeds' steps) | per seed | steps per seed |",
        "|---|---|---|---|",
    ]
    for t in table.values():
        seeds = " / ".join(_fmt(v, ".2e") for v in t["per_seed"])
        mark = " **chosen**" if t["lr"] == chosen else ""
        rows.append(
            f"| {t['lr']:g}{mark} | {_fmt(t['median'], '.2e')} | {seeds} | "
            f"{' / '.join(map(str, t['steps']))} |"
        )
    verdict = (
        f"Chosen rate: {chosen:g} (median approx-KL closest to {KL_TARGET:g} on a log scale "
        f"within [{lo:g}, {hi:g}])."
        if chosen is not None
        else f"No rate within [{lo:g}, {hi:g}]; the grid extends to {extend_to}."
    )
    data = {"rates": table, "chosen": chosen, "extend_to": extend_to, "band": list(KL_BAND)}
    return {"json": data, "markdown": "\n".join(rows) + "\n\n" + verdict + "\n"}


# --- one run --------------------------------------------------------------------------------


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _pooled(rows: Rows, share: str, count: str, steps: set[int] | None) -> tuple[int, int]:
    counts = step_counts(rows, share, count, steps)
    return sum(f for _, f, _ in counts), sum(n for _, _, n in counts)


def _share(fell: int, n: int) -> float | None:
    return fell / n if n else None


def window_shares(rows: Rows, collapse: int | None, steps: int = STEPS) -> list[dict[str, Any]]:
    """The 12 windows 1-25, ..., 276-300: positive responses that fell over positive responses,
    pooled over the window's steps; `before_fall` when the window lies wholly before the
    collapse step (or there is none)."""
    out = []
    for lo in range(1, steps + 1, WINDOW):
        hi = lo + WINDOW - 1
        fell, n = _pooled(rows, keys.SHARE_POS_FELL, keys.N_POS, set(range(lo, hi + 1)))
        out.append(
            {
                "window": f"{lo}-{hi}",
                "fell": fell,
                "responses": n,
                "share": _share(fell, n),
                "before_fall": collapse is None or hi < collapse,
            }
        )
    return out


def window_means(rows: Rows, key: str, steps: int = STEPS) -> list[float | None]:
    """The mean of `key` over each window's logged steps (None for a window without any): the
    training reward and the valid searches per rollout, read beside the window shares."""
    out = []
    for lo in range(1, steps + 1, WINDOW):
        vals = [
            v
            for r in rows
            if lo <= r["step"] < lo + WINDOW
            for v in [_num(r, key)]
            if v is not None
        ]
        out.append(sum(vals) / len(vals) if vals else None)
    return out


def probe_steps(rows: Rows) -> list[dict[str, Any]]:
    """Every in-run probe: high- and low-accuracy mixed groups and the share of each with drag
    over pull, and the share of correct responses whose first-order change is negative."""
    out = []
    for r in rows:
        groups_hi = _num(r, "probe/groups_acc_hi")
        if groups_hi is None:
            continue
        out.append(
            {
                "step": int(r["step"]),
                "groups_hi": int(groups_hi),
                "share_hi": _num(r, "probe/first_order_lld_share_acc_hi"),
                "groups_lo": int(_num(r, "probe/groups_acc_lo") or 0),
                "share_lo": _num(r, "probe/first_order_lld_share_acc_lo"),
                "correct": int(_num(r, "probe/correct_responses") or 0),
                "correct_share": _num(r, "probe/correct_first_order_fell_share"),
            }
        )
    return out


def run_summary(rows: Rows, warm_em: float | None = None) -> dict[str, Any]:
    """One run's numbers and whether LLD appeared in it under the protocol's two rules."""
    steps = [int(r["step"]) for r in rows]
    reward = [_num(r, keys.REWARD_MEAN) or 0.0 for r in rows]
    collapse = collapse_step(steps, reward) if rows else None
    before = {s for s in steps if collapse is None or s < collapse}
    windows = window_shares(rows, collapse)
    probes = probe_steps(rows)
    window_hit = next(
        (
            w["window"]
            for w in windows
            if w["before_fall"] and w["share"] is not None and w["share"] > WINDOW_SHARE_RULE
        ),
        None,
    )
    probe_hit = next(
        (
            p["step"]
            for p in probes
            if p["step"] in before
            and p["groups_hi"] >= PROBE_MIN_GROUPS
            and p["share_hi"] is not None
            and p["share_hi"] >= PROBE_SHARE_RULE
        ),
        None,
    )
    pooled = {
        name: _pooled(rows, share, keys.SHARE_COUNTS[share], before)
        for name, share in (
            ("all", keys.SHARE_POS_FELL),
            ("acc_lo", keys.SHARE_POS_FELL_ACC_LO),
            ("acc_hi", keys.SHARE_POS_FELL_ACC_HI),
            ("first_action", keys.SHARE_POS_FELL_FIRST_ACTION),
            ("later_actions", keys.SHARE_POS_FELL_LATER_ACTIONS),
        )
    }
    em = {0: warm_em} if warm_em is not None else {}
    em.update({int(r["step"]): _num(r, "eval/em") for r in rows if _num(r, "eval/em") is not None})
    clip = [
        None
        if _num(r, "policy/clip_frac_low") is None
        else (_num(r, "policy/clip_frac_low") or 0.0) + (_num(r, "policy/clip_frac_high") or 0.0)
        for r in rows
    ]
    return {
        "steps": max(steps, default=0),
        "collapse": collapse,
        "windows": windows,
        "probes": probes,
        "pooled_before_fall": {k: {"fell": f, "responses": n} for k, (f, n) in pooled.items()},
        "lld_window": window_hit,
        "lld_probe_step": probe_hit,
        "lld": window_hit is not None or probe_hit is not None,
        "em": em,
        "reward_by_window": window_means(rows, keys.REWARD_MEAN),
        "searches_by_window": window_means(rows, SEARCHES_KEY),
        "search_decline_step": next(
            (a.step for a in scan_alarms(rows) if a.kind == "search_decline"), None
        ),
        "medians": {
            "approx_kl": _median([_num(r, APPROX_KL) for r in rows]),
            "clip_frac": _median(clip),
            "mismatch_k3_kl": _median([_num(r, keys.MISMATCH_K3_KL) for r in rows]),
            "void_turn_share": _median([_num(r, keys.TURNS_VOID_SHARE) for r in rows]),
            "entropy": _median([_num(r, keys.ENTROPY) for r in rows]),
            "hidden_cosine": _median([_num(r, keys.HIDDEN_COSINE) for r in rows]),
            "shared_first_search_wrong": _median([_num(r, keys.OBS_MATCH) for r in rows]),
        },
    }


# --- the answers ----------------------------------------------------------------------------


def _pooled_share(arm_runs: Mapping[int, Mapping[str, Any]]) -> float | None:
    fell = sum(r["pooled_before_fall"]["all"]["fell"] for r in arm_runs.values())
    n = sum(r["pooled_before_fall"]["all"]["responses"] for r in arm_runs.values())
    return fell / n if n else None


def _final_em(arm_runs: Mapping[int, Mapping[str, Any]]) -> float | None:
    ems = [r["em"].get(STEPS) for r in arm_runs.values()]
    return None if not ems or None in ems else sum(ems) / len(ems)


def _is_complete(complete: Mapping[str, Mapping[int, bool]], arm: str, runs: Mapping) -> bool:
    return bool(runs.get(arm)) and all(complete.get(arm, {}).values())


def _prevention(
    grpo: Mapping[int, Mapping[str, Any]], arm_runs: Mapping[int, Mapping[str, Any]], name: str
) -> tuple[str, dict[str, list[Any]]]:
    """Version 1's three "LLDS prevents it" conditions for one LLDS arm against GRPO."""
    arm_lld = sum(r["lld"] for r in arm_runs.values())
    share_g, share_a = _pooled_share(grpo), _pooled_share(arm_runs)
    em_g, em_a = _final_em(grpo), _final_em(arm_runs)
    c1 = arm_lld <= 1
    c2 = share_g is not None and share_a is not None and share_a <= LLDS_SHARE_RATIO * share_g
    c3 = em_g is not None and em_a is not None and em_a >= em_g - LLDS_EM_MARGIN
    if c1 and c2 and c3:
        verdict = f"{name} prevents it"
    elif c2 and c3:
        verdict = f"{name} reduces but does not prevent it"
    else:
        verdict = f"{name} does not prevent it"
    conditions = {
        "lld_in_at_most_one_run": [c1, arm_lld],
        "pooled_share_at_most_half": [c2, share_a, share_g],
        "em_at_300_not_below_by_more_than_0.05": [c3, em_a, em_g],
    }
    return verdict, conditions


def search_answers(
    runs: Mapping[str, Mapping[int, Mapping[str, Any]]],
    complete: Mapping[str, Mapping[int, bool]],
) -> dict[str, str]:
    """Version 3's questions: does LLDS search less, and does LLDS-MA prevent it."""
    if not all(_is_complete(complete, a, runs) for a in ("grpo", "grpo-llds")):
        return {"llds_searches_less": "pending", "llds_ma_prevents_it": "pending"}

    def fired(arm: str) -> int:
        return sum(r["search_decline_step"] is not None for r in runs[arm].values())

    n_grpo, n_llds = fired("grpo"), fired("grpo-llds")
    counts = f"search_decline in {n_llds} of {len(runs['grpo-llds'])} grpo-llds runs and " + (
        f"{n_grpo} of {len(runs['grpo'])} grpo runs"
    )
    if not (n_llds >= 2 and n_grpo <= 1):
        return {"llds_searches_less": f"no: {counts}", "llds_ma_prevents_it": "not asked"}
    out = {"llds_searches_less": f"yes: {counts}"}
    if not _is_complete(complete, "grpo-llds-ma", runs):
        return {**out, "llds_ma_prevents_it": "pending"}
    n_ma = fired("grpo-llds-ma")
    em_ma, em_l = _final_em(runs["grpo-llds-ma"]), _final_em(runs["grpo-llds"])
    kept = n_ma <= 1 and em_ma is not None and em_l is not None and em_ma >= em_l
    said = f"search_decline in {n_ma} of {len(runs['grpo-llds-ma'])}; EM at 300 {em_ma} vs {em_l}"
    verdict = "LLDS-MA prevents LLDS's search decline" if kept else "it does not"
    return {**out, "llds_ma_prevents_it": f"{verdict} ({said})"}


def answers(
    runs: Mapping[str, Mapping[int, Mapping[str, Any]]],
    complete: Mapping[str, Mapping[int, bool]],
) -> dict[str, Any]:
    """The protocol's answers, from complete runs only (`pending` until all are)."""
    searches = search_answers(runs, complete)
    grpo = runs.get("grpo", {})
    if not _is_complete(complete, "grpo", runs):
        return {"lld_under_grpo": "pending", "llds": "pending", **searches}
    grpo_lld = sum(r["lld"] for r in grpo.values())
    if grpo_lld < 2:
        return {
            "lld_under_grpo": f"no: LLD in {grpo_lld} of {len(grpo)} grpo runs",
            "llds": "not testable",
            **searches,
        }
    out: dict[str, Any] = {
        "lld_under_grpo": f"yes: LLD in {grpo_lld} of {len(grpo)} grpo runs",
        "llds": "pending",
        **searches,
    }
    if _is_complete(complete, "grpo-llds", runs):
        out["llds"], out["conditions"] = _prevention(grpo, runs["grpo-llds"], "LLDS")
    if _is_complete(complete, "grpo-llds-ma", runs):
        out["llds_ma"], out["conditions_ma"] = _prevention(grpo, runs["grpo-llds-ma"], "LLDS-MA")
    return out


def arm_over_seeds(
    by_seed: Mapping[int, Mapping[str, Any]], done: Mapping[int, bool]
) -> dict[str, Any]:
    """One arm's complete runs side by side: the pooled share before any fall and the held-out
    EM at step 300 per seed, with their median, mean and standard error, and the collapses."""
    seeds = sorted(s for s in by_seed if done.get(s))
    shares = [by_seed[s]["pooled_before_fall"]["all"] for s in seeds]
    share_values = [_share(d["fell"], d["responses"]) for d in shares]
    ems = [by_seed[s]["em"].get(STEPS) for s in seeds]
    return {
        "seeds": seeds,
        "share": share_values,
        "share_spread": seed_spread(share_values),
        "em_300": ems,
        "em_spread": seed_spread(ems),
        "collapses": [by_seed[s]["collapse"] for s in seeds],
    }


def _warm_em(eval_root: Path | None) -> float | None:
    if eval_root is None:
        return None
    from llds.runs.eval_result import EvalResult, eval_file

    path = eval_file(eval_root / "warm_eval", 0)
    return EvalResult.read(path).overall.em if path.is_file() else None


def _counts(d: Mapping[str, int]) -> str:
    share = _share(d["fell"], d["responses"])
    return f"{_fmt(share)} ({d['fell']}/{d['responses']})"


def study_summary(
    rows: Mapping[str, Mapping[int, Rows]],
    complete: Mapping[str, Mapping[int, bool]],
    eval_root: Path | None = None,
) -> dict[str, Any]:
    """Every run's tables and the answers, as JSON and markdown."""
    warm = _warm_em(eval_root)
    runs = {
        arm: {s: run_summary(r, warm) for s, r in by_seed.items() if r}
        for arm, by_seed in rows.items()
    }
    done = {arm: {s: complete[arm][s] and bool(rows[arm][s]) for s in rows[arm]} for arm in rows}
    result = answers(runs, done)
    md = ["# Theorem-world study: every run", ""]
    if not all(all(v.values()) for v in done.values()):
        md += ["**Partial**: runs still going are marked with their last step.", ""]
    md += [
        "| arm | seed | steps | collapse | pooled share fell before any fall (fell/positive) "
        "| group acc <= 0.5 | > 0.5 | first action | later actions | LLD rule 1 (window) "
        "| LLD rule 2 (probe step) | held-out EM (step: EM) | median approx-KL | median clip "
        "| median mismatch k3 | median void turns |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, by_seed in runs.items():
        for seed, r in sorted(by_seed.items()):
            p = r["pooled_before_fall"]
            steps = f"{r['steps']}" + ("" if done[arm][seed] else " (partial)")
            em = ", ".join(f"{s}: {v:.3f}" for s, v in sorted(r["em"].items()))
            m = r["medians"]
            md.append(
                f"| {arm} | {seed} | {steps} | {r['collapse'] or '-'} | {_counts(p['all'])} "
                f"| {_counts(p['acc_lo'])} | {_counts(p['acc_hi'])} "
                f"| {_counts(p['first_action'])} | {_counts(p['later_actions'])} "
                f"| {r['lld_window'] or '-'} | {r['lld_probe_step'] or '-'} | {em or '-'} "
                f"| {_fmt(m['approx_kl'], '.2e')} | {_fmt(m['clip_frac'])} "
                f"| {_fmt(m['mismatch_k3_kl'], '.2e')} | {_fmt(m['void_turn_share'])} |"
            )
    md += [
        "",
        "Mismatch `-`: not logged, because there is none to measure: the rollouts are sampled by "
        "the trained policy itself in float32 and pi_old is taken from them (`mismatch/*` is "
        "logged only when another copy samples or pi_old is recomputed). A collapse is the "
        "pre-registered one (`llds.report.collapse.collapse_step`).",
    ]
    md += ["", "## Window shares (positive responses that fell / positive, pooled per window)", ""]
    md += [
        "| arm | seed | "
        + " | ".join(f"{lo}-{lo + WINDOW - 1}" for lo in range(1, STEPS + 1, WINDOW))
        + " |"
    ]
    md += ["|---|---|" + "---|" * (STEPS // WINDOW)]
    for arm, by_seed in runs.items():
        for seed, r in sorted(by_seed.items()):
            cells = [
                ("-" if w["responses"] == 0 else f"{w['share']:.2f} ({w['fell']}/{w['responses']})")
                + ("" if w["before_fall"] else " (after fall)")
                for w in r["windows"]
            ]
            md.append(f"| {arm} | {seed} | " + " | ".join(cells) + " |")
    md += [
        "",
        "## Training reward / valid searches per rollout (means per window)",
        "",
        "Read beside the shares: a fall of the reward, and whether the agent searches less. "
        "`search_decline` is the step of the monitor's warning (a quarter fewer valid searches "
        "than over the first 20 steps; added after seed 1's GRPO+LLDS run, see "
        "docs/diagnostics.md), `-` if it never fired.",
        "",
        "| arm | seed | search_decline | "
        + " | ".join(f"{lo}-{lo + WINDOW - 1}" for lo in range(1, STEPS + 1, WINDOW))
        + " |",
        "|---|---|---|" + "---|" * (STEPS // WINDOW),
    ]
    for arm, by_seed in runs.items():
        for seed, r in sorted(by_seed.items()):
            cells = [
                "-" if rw is None else f"{rw:.2f} / {_fmt(sr, '.2f')}"
                for rw, sr in zip(r["reward_by_window"], r["searches_by_window"], strict=True)
            ]
            first = r["search_decline_step"] or "-"
            md.append(f"| {arm} | {seed} | {first} | " + " | ".join(cells) + " |")
    md += [
        "",
        "## Probe (first order, groups of 8 on 64 fixed training questions)",
        "",
        "Each cell: high-accuracy mixed groups with drag over pull / such groups; low-accuracy "
        "likewise; correct responses whose first-order change is negative / correct responses.",
        "",
        "| arm | seed | step | acc > 0.5: groups with drag over pull | acc <= 0.5 "
        "| correct responses |",
        "|---|---|---|---|---|---|",
    ]
    for arm, by_seed in runs.items():
        for seed, r in sorted(by_seed.items()):
            for p in r["probes"]:
                hi = round((p["share_hi"] or 0) * p["groups_hi"])
                lo = round((p["share_lo"] or 0) * p["groups_lo"])
                fell = round((p["correct_share"] or 0) * p["correct"])
                md.append(
                    f"| {arm} | {seed} | {p['step']} | {hi}/{p['groups_hi']} | "
                    f"{lo}/{p['groups_lo']} | {fell}/{p['correct']} |"
                )
    md += [
        "",
        "## Per arm over seeds (complete runs only)",
        "",
        "Each cell: every seed's value in seed order; then their median, and their mean ± one "
        "standard error (sample s.d. / sqrt(seeds)).",
        "",
        "| arm | seeds | pooled share fell before any fall | held-out EM at 300 | collapse |",
        "|---|---|---|---|---|",
    ]
    spreads = {arm: arm_over_seeds(by_seed, done[arm]) for arm, by_seed in runs.items()}
    for arm, a in spreads.items():
        collapses = " / ".join(str(c) if c else "none" for c in a["collapses"]) or "-"
        md.append(
            f"| {arm} | {', '.join(map(str, a['seeds'])) or '-'} "
            f"| {spread_md(a['share'], a['share_spread'])} "
            f"| {spread_md(a['em_300'], a['em_spread'])} | {collapses} |"
        )
    md += [
        "",
        "## Answers (pre-registered rules; complete runs only)",
        "",
        f"- LLD under GRPO: {result['lld_under_grpo']}",
        f"- LLDS: {result['llds']}",
    ]
    if "conditions" in result:
        for name, value in result["conditions"].items():
            md.append(f"  - {name}: {value}")
    if "llds_ma" in result:
        md.append(f"- LLDS-MA against LLD: {result['llds_ma']}")
        for name, value in result["conditions_ma"].items():
            md.append(f"  - {name}: {value}")
    md += [
        f"- Does LLDS search less (version 3): {result['llds_searches_less']}",
        f"- Does LLDS-MA prevent it: {result['llds_ma_prevents_it']}",
    ]
    if warm is not None:
        md += ["", f"Warm start held-out EM (step 0 of every run): {warm:.3f}."]
    return {
        "json": {
            "runs": runs,
            "complete": done,
            "per_arm": spreads,
            "answers": result,
            "warm_em": warm,
        },
        "markdown": "\n".join(md) + "\n",
    }
