"""The LLDS-strength study (`experiments/llds_strength/PROTOCOL.md`): its arms and, from the
runs' per-step logs, its tables and the pre-registered answers."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from llds import metrics as keys
from llds.analysis.pooled import step_counts
from llds.analysis.seeds import seed_spread
from llds.analysis.study_logs import COMMITTED_LOG, read_committed_metrics

Rows = Sequence[Mapping[str, Any]]

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

# --- everything below: pure functions of the runs' logged rows (PROTOCOL.md, "Questions and
# rules"); shares are pooled over responses, never medians of per-step shares

LATE_STEPS = range(26, STEPS + 1)
HALF = 0.5
REWARD_MARGIN = 0.05
SLOPE_T = 2.0
MOSTLY_OTHERS, MOSTLY_WITHIN = 0.5, 0.8
LLDS_KEYS = (
    "llds/loss",
    "llds/gate_frac",
    "llds/penalized_token_frac",
    keys.LLDS_REST_LOSS,
)
COST_KEYS = {
    "time_update": "time/update",
    "update_ratio": keys.UPDATE_RATIO,
    "approx_kl": "policy/approx_kl",
}


def _num(row: Mapping[str, Any], key: str) -> float | None:
    v = row.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def _pooled(rows: Rows, share: str, count: str) -> tuple[int, int]:
    counts = step_counts(rows, share, count)
    return sum(f for _, f, _ in counts), sum(n for _, _, n in counts)


def _ratio(fell: int, n: int) -> float | None:
    return fell / n if n else None


def binomial_se(fell: int, n: int) -> float | None:
    """sqrt(p(1-p)/n): responses treated as independent (they are not; see the protocol)."""
    if not n:
        return None
    p = fell / n
    return math.sqrt(p * (1 - p) / n)


def _mean_over(rows: Rows, key: str, steps: range) -> float | None:
    values = [v for r in rows if int(r["step"]) in steps and (v := _num(r, key)) is not None]
    return statistics.mean(values) if values else None


def _median_of(rows: Rows, key: str) -> float | None:
    values = [v for r in rows if (v := _num(r, key)) is not None]
    return statistics.median(values) if values else None


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def run_summary(rows: Rows, mini_batches: int = 10) -> dict[str, Any]:
    """One run: its pooled shares (all, by group accuracy, by mini-batch index) with their
    counts, its late reward and entropy, held-out EM at the last step, LLDS's and the update's
    statistics (medians over steps)."""
    last = max((int(r["step"]) for r in rows), default=0)
    fell, n = _pooled(rows, keys.SHARE_POS_FELL, keys.N_POS)
    out: dict[str, Any] = {
        "steps": last,
        "complete": last >= STEPS,
        "share": {"fell": fell, "responses": n},
        "by_accuracy": {},
        "by_minibatch": [],
        "reward_26_50": _mean_over(rows, keys.REWARD_MEAN, LATE_STEPS),
        "entropy_26_50": _mean_over(rows, keys.ENTROPY, LATE_STEPS),
        "em": {int(r["step"]): _num(r, "eval/em") for r in rows if _num(r, "eval/em") is not None},
        "llds": {k: _median_of(rows, k) for k in LLDS_KEYS},
        "update": {name: _median_of(rows, k) for name, k in COST_KEYS.items()},
    }
    for name, share, count in (
        ("lo", keys.SHARE_POS_FELL_ACC_LO, keys.N_POS_ACC_LO),
        ("hi", keys.SHARE_POS_FELL_ACC_HI, keys.N_POS_ACC_HI),
    ):
        f, m = _pooled(rows, share, count)
        out["by_accuracy"][name] = {"fell": f, "responses": m}
    for part in range(mini_batches):
        f, m = _pooled(rows, *keys.minibatch_share_keys(part))
        out["by_minibatch"].append({"fell": f, "responses": m})
    return out


def arm_summary(by_seed: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """One arm's complete runs: each seed's pooled share, S (their median), the share pooled
    over seeds with its binomial SE, the seeds' spread, and the medians of the cost measures."""
    seeds = sorted(s for s, r in by_seed.items() if r["complete"])
    runs = [by_seed[s] for s in seeds]
    shares = [_ratio(r["share"]["fell"], r["share"]["responses"]) for r in runs]
    fell = sum(r["share"]["fell"] for r in runs)
    n = sum(r["share"]["responses"] for r in runs)
    parts = len(runs[0]["by_minibatch"]) if runs else 0
    by_k = []
    for k in range(parts):
        f = sum(r["by_minibatch"][k]["fell"] for r in runs)
        m = sum(r["by_minibatch"][k]["responses"] for r in runs)
        by_k.append({"fell": f, "responses": m, "share": _ratio(f, m), "se": binomial_se(f, m)})
    by_acc = {}
    for name in ("lo", "hi"):
        f = sum(r["by_accuracy"][name]["fell"] for r in runs)
        m = sum(r["by_accuracy"][name]["responses"] for r in runs)
        by_acc[name] = {"fell": f, "responses": m, "share": _ratio(f, m)}
    return {
        "seeds": seeds,
        "started": sorted(by_seed),
        "shares": shares,
        "S": _median(shares),
        "spread": seed_spread(shares),
        "pooled": {
            "fell": fell,
            "responses": n,
            "share": _ratio(fell, n),
            "se": binomial_se(fell, n),
        },
        "by_accuracy": by_acc,
        "by_minibatch": by_k,
        "reward_26_50": [r["reward_26_50"] for r in runs],
        "entropy_26_50": [r["entropy_26_50"] for r in runs],
        "em_50": [r["em"].get(STEPS) for r in runs],
        "llds": {k: _median([r["llds"][k] for r in runs]) for k in LLDS_KEYS},
        "update": {k: _median([r["update"][k] for r in runs]) for k in COST_KEYS},
    }


def _ready(arm: Mapping[str, Any] | None) -> bool:
    return arm is not None and len(arm["seeds"]) == len(SEEDS)


def _not_ready(arms: Mapping[str, Mapping[str, Any]], names: Sequence[str]) -> str:
    done = ", ".join(f"{a} {len(arms[a]['seeds']) if a in arms else 0}/{len(SEEDS)}" for a in names)
    return f"not yet: complete seeds {done}"


def _halves(lam: Mapping[str, Any], base: Mapping[str, Any]) -> bool:
    """Rule 1's 'halves': S at most half of GRPO's, and every seed below GRPO's lowest seed."""
    return lam["S"] <= HALF * base["S"] and max(lam["shares"]) < min(base["shares"])


def _affordable(lam: Mapping[str, Any], base: Mapping[str, Any]) -> bool:
    return _median(lam["reward_26_50"]) >= _median(base["reward_26_50"]) - REWARD_MARGIN


def dose_answer(arms: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Rule 1: the smallest lambda that halves GRPO's share, and each lambda's cost."""
    names = list(DOSE_ARMS)
    if not all(_ready(arms.get(a)) for a in names):
        return {"answer": _not_ready(arms, names)}
    base = arms["lam0"]
    rows = {}
    for a in names[1:]:
        lam = arms[a]
        rows[a] = {
            "halves": _halves(lam, base),
            "affordable": _affordable(lam, base),
            "S_ratio": lam["S"] / base["S"] if base["S"] else None,
            "reward_change": _median(lam["reward_26_50"]) - _median(base["reward_26_50"]),
            "entropy_change": _median(lam["entropy_26_50"]) - _median(base["entropy_26_50"]),
            "em_change": _diff(_median(lam["em_50"]), _median(base["em_50"])),
        }
    halving = [a for a in names[1:] if rows[a]["halves"]]
    answer = f"lambda = {DOSE_ARMS[halving[0]]:g}" if halving else "none"
    return {"answer": answer, "per_lambda": rows}


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def reduction_by_k(base: Mapping[str, Any], llds: Mapping[str, Any]) -> list[dict[str, Any]]:
    """R(k) = share_k(GRPO) - share_k(LLDS), each pooled over steps and seeds, with the SE of
    the difference (binomial, the two independent)."""
    out = []
    for k, (b, l) in enumerate(zip(base["by_minibatch"], llds["by_minibatch"], strict=True), 1):
        if b["share"] is None or l["share"] is None:
            continue
        se = math.sqrt(b["se"] ** 2 + l["se"] ** 2)
        out.append({"k": k, "R": b["share"] - l["share"], "se": se})
    return out


def least_squares_slope(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float | None]:
    """Slope of y on x by ordinary least squares and its SE from the residuals (None with
    fewer than 3 points or no spread in x)."""
    n = len(xs)
    mx, my = statistics.mean(xs), statistics.mean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    if n < 3 or sxx == 0:
        return slope, None
    resid = [y - my - slope * (x - mx) for x, y in zip(xs, ys, strict=True)]
    return slope, math.sqrt(sum(r * r for r in resid) / (n - 2) / sxx)


def mechanism_answers(arms: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Rules 2 and 3: does LLDS's reduction grow with k; how much of GRPO's share needs
    sequential mini-batches."""
    out: dict[str, Any] = {}
    if _ready(arms.get("lam0")) and _ready(arms.get("lam0.2")):
        red = reduction_by_k(arms["lam0"], arms["lam0.2"])
        first = next((r for r in red if r["k"] == 1), None)
        slope, se = least_squares_slope([r["k"] for r in red], [r["R"] for r in red])
        at_one = first is not None and abs(first["R"]) <= SLOPE_T * first["se"]
        grows = se is not None and slope > 0 and (se == 0 or slope / se >= SLOPE_T)
        out["by_k"] = {
            "answer": "yes" if at_one and grows else "no",
            "R": red,
            "slope": slope,
            "slope_se": se,
            "R1_within_2se": at_one,
        }
    else:
        out["by_k"] = {"answer": _not_ready(arms, ["lam0", "lam0.2"])}
    if _ready(arms.get("lam0")) and _ready(arms.get("mb1-lam0")):
        ratio = arms["mb1-lam0"]["S"] / arms["lam0"]["S"]
        if ratio < MOSTLY_OTHERS:
            what = "mostly the other mini-batches' updates"
        elif ratio > MOSTLY_WITHIN:
            what = "mostly within one update"
        else:
            what = "both"
        out["sequential"] = {"answer": what, "ratio": ratio}
    else:
        out["sequential"] = {"answer": _not_ready(arms, ["lam0", "mb1-lam0"])}
    return out


def variant_answer(arms: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Rule 4: does LLDS at every mini-batch halve the share, reach further than the paper's
    scope, and at what time cost."""
    names = ["lam0", "lam0.2", "batch-lam0.2"]
    if not all(_ready(arms.get(a)) for a in names):
        return {"answer": _not_ready(arms, names)}
    base, paper, var = (arms[a] for a in names)
    further = var["S"] < paper["S"] and max(var["shares"]) < min(paper["shares"])
    t_var, t_paper = var["update"]["time_update"], paper["update"]["time_update"]
    return {
        "answer": "yes" if var["S"] <= HALF * base["S"] else "no",
        "further_than_minibatch": further,
        "time_update_ratio": t_var / t_paper if t_var and t_paper else None,
    }


def confirmation_lambda(arms: Mapping[str, Mapping[str, Any]]) -> float | None:
    """Rule 5: the smallest affordable lambda that halves the share; else the affordable one
    with the lowest S; else 0.2. None until the dose arms are complete."""
    names = list(DOSE_ARMS)
    if not all(_ready(arms.get(a)) for a in names):
        return None
    base = arms["lam0"]
    ok = [a for a in names[1:] if _affordable(arms[a], base)]
    halving = [a for a in ok if _halves(arms[a], base)]
    if halving:
        return DOSE_ARMS[halving[0]]
    if ok:
        return DOSE_ARMS[min(ok, key=lambda a: (arms[a]["S"], DOSE_ARMS[a]))]
    return 0.2


# --- the tables --------------------------------------------------------------------------------


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _count_share(d: Mapping[str, Any]) -> str:
    return f"{_fmt(_ratio(d['fell'], d['responses']))} ({d['fell']}/{d['responses']})"


def study_summary(runs: Mapping[str, Mapping[int, Rows]]) -> dict[str, Any]:
    """The study's tables and answers from every run's logged rows, `{arm: {seed: rows}}`
    (runs not started are absent; partial runs are listed and kept out of the answers)."""
    per_run = {
        arm: {seed: run_summary(rows, _parts(arm)) for seed, rows in sorted(by_seed.items())}
        for arm, by_seed in runs.items()
    }
    arms = {arm: arm_summary(by_seed) for arm, by_seed in per_run.items() if by_seed}
    answers = {
        "dose": dose_answer(arms),
        **mechanism_answers(arms),
        "variant": variant_answer(arms),
        "confirmation_lambda": confirmation_lambda(arms),
    }
    data = {"runs": per_run, "arms": arms, "answers": answers}
    return {"json": data, "markdown": _markdown(per_run, arms, answers)}


def _parts(arm: str) -> int:
    return 1 if "optim.mini_batches=1" in ARMS.get(arm, []) else 10


def _markdown(
    per_run: Mapping[str, Mapping[int, Mapping[str, Any]]],
    arms: Mapping[str, Mapping[str, Any]],
    answers: Mapping[str, Any],
) -> str:
    out = [
        "# The LLDS-strength study: tables",
        "",
        "Written by `experiments/llds_strength/tables.py` from `results/runs/*/seed*/"
        "metrics.jsonl.gz` (PROTOCOL.md). Shares: of the responses GRPO pushed up, those whose "
        "summed log-likelihood fell in the step's update, pooled over responses (fell/count).",
        "",
        "## Every run",
        "",
        "| arm | seed | steps | share | share, low-accuracy groups | share, high-accuracy groups"
        " | reward 26-50 | entropy 26-50 | EM at 50 | llds/loss | llds/gate_frac"
        " | time/update (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, by_seed in per_run.items():
        for seed, r in by_seed.items():
            steps = f"{r['steps']}" + ("" if r["complete"] else " (partial)")
            out.append(
                f"| {arm} | {seed} | {steps} | {_count_share(r['share'])}"
                f" | {_count_share(r['by_accuracy']['lo'])}"
                f" | {_count_share(r['by_accuracy']['hi'])}"
                f" | {_fmt(r['reward_26_50'])} | {_fmt(r['entropy_26_50'])}"
                f" | {_fmt(r['em'].get(STEPS))} | {_fmt(r['llds']['llds/loss'], '.4f')}"
                f" | {_fmt(r['llds']['llds/gate_frac'])}"
                f" | {_fmt(r['update']['time_update'], '.1f')} |"
            )
    out += [
        "",
        "## Every arm (complete runs only)",
        "",
        "S is the median over seeds of each seed's pooled share; SE(seeds) is one standard error"
        " of the seeds' mean share (sample s.d. / sqrt(seeds)); the binomial SE of the share "
        "pooled over seeds treats responses as independent, which they are not.",
        "",
        "| arm | complete seeds | per-seed shares | S | mean +- SE(seeds) | pooled +- binomial SE"
        " | low / high accuracy | reward 26-50 (per seed) | entropy 26-50 (per seed)"
        " | EM at 50 (per seed) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, a in arms.items():
        if not a["seeds"]:
            continue
        sp, pooled = a["spread"], a["pooled"]
        per = " / ".join(_fmt(v) for v in a["shares"])
        out.append(
            f"| {arm} | {len(a['seeds'])} | {per} | {_fmt(a['S'])}"
            f" | {_fmt(sp['mean'])} +- {_fmt(sp['se'])}"
            f" | {_fmt(pooled['share'])} +- {_fmt(pooled['se'])}"
            f" | {_fmt(a['by_accuracy']['lo']['share'])} / {_fmt(a['by_accuracy']['hi']['share'])}"
            f" | {' / '.join(_fmt(v) for v in a['reward_26_50'])}"
            f" | {' / '.join(_fmt(v) for v in a['entropy_26_50'])}"
            f" | {' / '.join(_fmt(v) for v in a['em_50'])} |"
        )
    ten = [a for a, s in arms.items() if s["seeds"] and len(s["by_minibatch"]) == 10]
    if ten:
        out += [
            "",
            "## Share by mini-batch index k (complete runs, pooled over steps and seeds)",
            "",
            "| k | " + " | ".join(ten) + " |",
            "|---|" + "---|" * len(ten),
        ]
        for k in range(10):
            cells = [_count_share(arms[a]["by_minibatch"][k]) for a in ten]
            out.append(f"| {k + 1} | " + " | ".join(cells) + " |")
    out += ["", "## Answers (PROTOCOL.md, rules 1-5)", ""]
    out += _answer_lines(answers)
    return "\n".join(out) + "\n"


def _answer_lines(answers: Mapping[str, Any]) -> list[str]:
    dose, by_k, seq, var = (answers[k] for k in ("dose", "by_k", "sequential", "variant"))
    lines = [f"1. **Which lambda halves GRPO's share?** {dose['answer']}"]
    for arm, row in dose.get("per_lambda", {}).items():
        lines.append(
            f"   - {arm}: S/S(lam0) {_fmt(row['S_ratio'])}, halves: {row['halves']}, "
            f"reward change {_fmt(row['reward_change'], '+.3f')} (affordable: "
            f"{row['affordable']}), entropy change {_fmt(row['entropy_change'], '+.3f')}, "
            f"EM change {_fmt(row['em_change'], '+.3f')}"
        )
    lines.append(f"2. **Does LLDS's reduction grow with k?** {by_k['answer']}")
    if "R" in by_k:
        cells = ", ".join(f"k={r['k']}: {r['R']:+.3f} +- {r['se']:.3f}" for r in by_k["R"])
        lines.append(
            f"   - R(k): {cells}; slope {_fmt(by_k['slope'], '+.4f')} +- "
            f"{_fmt(by_k['slope_se'], '.4f')}; R(1) within 2 SE of 0: {by_k['R1_within_2se']}"
        )
    ratio = f" (S(mb1-lam0)/S(lam0) = {_fmt(seq['ratio'])})" if "ratio" in seq else ""
    lines.append(
        f"3. **How much of GRPO's share needs sequential mini-batches?** {seq['answer']}{ratio}"
    )
    extra = ""
    if "further_than_minibatch" in var:
        extra = (
            f" (further than the paper's scope: {var['further_than_minibatch']}; "
            f"time/update x{_fmt(var['time_update_ratio'], '.2f')} of lam0.2's)"
        )
    lines.append(f"4. **Does LLDS at every mini-batch halve the share?** {var['answer']}{extra}")
    lam = answers["confirmation_lambda"]
    lines.append(
        "5. **The confirmation's lambda:** "
        + ("not yet (the dose arms are incomplete)" if lam is None else f"{lam:g}")
    )
    return lines


def load_logs(root: Path) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """`{arm: {seed: rows}}` from `root/ARM/seedN/metrics.jsonl.gz` (the study's committed logs),
    arms in the protocol's order."""
    out: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for arm in ARMS:
        for seed in SEEDS:
            path = root / arm / f"seed{seed}" / COMMITTED_LOG
            if path.is_file():
                out.setdefault(arm, {})[seed] = read_committed_metrics(path)
    return out
