"""The study's tables from the committed logs alone (`run.py --tables`): `pilot.md`, and
`summary.json` / `summary.md` with the protocol's answers ("What counts as yes") and every
seed's figures, so that a reader recomputes them from what is committed."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from llds.analysis.pooled import summarize
from llds.analysis.seeds import median_over_seeds, seed_spread
from llds.analysis.significance import exact_permutation_p
from llds.analysis.study_logs import arm_dir_name
from llds.io import atomic_write, write_json
from smollm2_wiki.answer import MIN_GAIN, TEST, TRANSFER, binomial_se
from smollm2_wiki_lora.decisions import pilot_scores, read_decisions
from smollm2_wiki_lora.protocol import (
    GRPO,
    K3_KEY,
    LLDS,
    PHASES,
    PILOT_LRS,
    PILOT_RANK,
    PILOT_SEED,
    RANK_ARM,
    SEEDS,
    SMALL_RANK,
    STEP0,
    STUDY_ARMS,
    Stage,
    cell,
    ordered,
    stage_rows,
)


def read_evals(path: Path) -> dict[int, dict[str, Any]]:
    """A collected `eval.json`'s scores by step ({} when none is collected)."""
    if not path.is_file():
        return {}
    return {int(k): v for k, v in json.loads(path.read_text(encoding="utf-8")).items()}


def source_em(scores: Mapping[str, Any], source: str) -> tuple[float | None, int]:
    """One source's EM and question count in a collected evaluation's scores, (None, 0) where
    it has no questions (`smollm2_wiki.answer` reads whole evaluation files instead)."""
    got = scores.get("by_source", {}).get(source) or {}
    return (got.get("em"), int(got.get("n", 0))) if got.get("n") else (None, 0)


def _mean(rows: Sequence[Mapping[str, Any]], key_: str, steps: range) -> float | None:
    v = [float(r[key_]) for r in rows if int(r["step"]) in steps and _is_num(r.get(key_))]
    return statistics.fmean(v) if v else None


def _median(rows: Sequence[Mapping[str, Any]], key_: str, steps: range | None = None):
    v = [
        float(r[key_])
        for r in rows
        if _is_num(r.get(key_)) and (steps is None or int(r["step"]) in steps)
    ]
    return statistics.median(v) if v else None


def _is_num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def windows(stage: Stage) -> list[range]:
    """The stage's windows between evaluations: 1-10, 11-20, ... (pilot); 1-40, ... (study)."""
    return [range(s - stage.eval_every + 1, s + 1) for s in stage.eval_steps]


def pilot_table(results: Path, stage: Stage) -> str:
    """`pilot.md`: every pilot run from its committed log, and the choice."""
    scores = pilot_scores(results, stage)
    step0 = read_evals(results / "runs" / "pilot" / STEP0 / "eval.json").get(0)
    em0 = step0["overall"]["em"] if step0 else None
    decisions = read_decisions(results)
    lr_rank = {a: (lr, PILOT_RANK) for a, lr in PILOT_LRS.items()}
    if "learning_rate" in decisions:
        lr_rank[RANK_ARM] = (decisions["learning_rate"]["lr"], SMALL_RANK)
    ws = windows(stage)
    head = ["run", "lr", "rank", "steps", "dev EM at 0"]
    head += [str(s) for s in stage.eval_steps] + [f"mean ({stage.eval_steps[0]}-{stage.steps})"]
    head += [f"reward {w.start}-{w.stop - 1}" for w in ws]
    head += ["searches", "entropy", "k3 KL (median)", "step s (median)", "out"]
    lines = [
        "# SmolLM2-wiki LoRA pilot",
        "",
        "Written by `run.py --tables` from the committed logs (`runs/pilot/`); seed "
        f"{PILOT_SEED}, GRPO, {stage.steps} steps, greedy dev EM every {stage.eval_every} steps "
        "(step 0: the warm start under the runs' precision). Reward, searches and entropy are "
        "means over the steps; the rules: PROTOCOL.md, decision 2.",
        "",
        "| " + " | ".join(head) + " |",
        "|---" * len(head) + "|",
    ]
    for arm, s in scores.items():
        rows = stage_rows(results, "pilot", arm, PILOT_SEED)
        lr, rank = lr_rank.get(arm, (None, SMALL_RANK))
        every = range(1, stage.steps + 1)
        cells = [arm, cell(lr, "g"), str(rank), str(s.steps), cell(em0, ".3f")]
        cells += [cell(s.evals.get(k), ".3f") for k in stage.eval_steps]
        cells.append(cell(s.mean_em, ".3f"))
        cells += [cell(_mean(rows, "reward/mean", w), ".3f") for w in ws]
        cells.append(cell(_mean(rows, "rollout/valid_searches", every), ".2f"))
        cells.append(cell(_mean(rows, "policy/entropy", every), ".3f"))
        cells.append(cell(_median(rows, K3_KEY), ".2e"))
        cells.append(cell(_median(rows, "time/step"), ".1f"))
        cells.append(s.out or ("-" if s.complete else "not complete"))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## The choice", ""]
    lr, rank, corr = (decisions.get(k) for k in ("learning_rate", "rank", "correction"))
    lines.append(
        f"Learning rate: **{lr['lr']:g}** ({lr['arm']})." if lr else "Learning rate: not yet."
    )
    lines.append(f"Rank: **{rank['rank']}**." if rank else "Rank: not yet.")
    if corr:
        lines.append(
            "Mismatch correction: **"
            + ("truncated importance sampling, cap 2" if corr["applies"] else "none")
            + f"** ({corr['why']})."
        )
    else:
        lines.append("Mismatch correction: not yet.")
    return "\n".join(lines) + "\n"


def study_summary(results: Path, stage: Stage) -> dict[str, Any]:
    """The protocol's figures and answers from the committed study logs (summary.json)."""
    warm = read_evals(results / "runs" / "study" / STEP0 / "eval.json").get(0)
    warm_test, n_test = source_em(warm, TEST) if warm else (None, 0)
    warm_transfer, n_transfer = source_em(warm, TRANSFER) if warm else (None, 0)
    at = stage.steps
    runs: dict[str, dict[str, Any]] = {}
    for arm, seed in ordered("study", None, None):
        base = results / "runs" / "study" / arm_dir_name(arm) / f"seed{seed}"
        evals = read_evals(base / "eval.json")
        rows = stage_rows(results, "study", arm, seed)
        if not rows and not evals:
            continue
        runs.setdefault(arm, {})[str(seed)] = run_figures(base, rows, evals, stage)
    out: dict[str, Any] = {
        "protocol": "experiments/smollm2_wiki_lora/PROTOCOL.md",
        "step": at,
        "warm_start": {
            "test_em": warm_test,
            "test_n": n_test,
            "transfer_em": warm_transfer,
            "transfer_n": n_transfer,
            "test_se": binomial_se(warm_test, n_test) if warm_test is not None else None,
            "transfer_se": (
                binomial_se(warm_transfer, n_transfer) if warm_transfer is not None else None
            ),
        },
        "runs": runs,
    }
    for name in ("test", "transfer"):
        out[name] = answers(runs, out["warm_start"], name, at)
    out["answer"] = out["test"]["grpo_improves"]
    out["llds_answer"] = out["test"]["llds_vs_grpo"]["verdict"]
    return out


def run_figures(base: Path, rows, evals, stage: Stage) -> dict[str, Any]:
    """One study run: its EM per evaluation and source, and its windows' figures."""
    alarms = []
    if (base / "alarms.jsonl").is_file():
        alarms = [json.loads(x) for x in (base / "alarms.jsonl").read_text().splitlines() if x]
    per_window = []
    for w in windows(stage):
        lld = summarize(rows, steps=w)
        kinds: dict[str, int] = {}
        for a in alarms:
            if int(a.get("step", 0)) in w:
                kinds[str(a.get("kind"))] = kinds.get(str(a.get("kind")), 0) + 1
        per_window.append(
            {
                "steps": [w.start, w.stop - 1],
                "lld_pooled_share": lld.pooled,
                "lld_responses": lld.responses,
                "lld_step_quartiles": lld.quartiles,
                "reward": _mean(rows, "reward/mean", w),
                "searches": _mean(rows, "rollout/valid_searches", w),
                "entropy": _mean(rows, "policy/entropy", w),
                "k3_kl_median": _median(rows, K3_KEY, w),
                "alarms": dict(sorted(kinds.items())),
            }
        )
    ckpt = base / "checkpoint.json"
    return {
        "steps": max((int(r["step"]) for r in rows), default=0),
        "test": {str(s): source_em(e, TEST)[0] for s, e in sorted(evals.items())},
        "transfer": {str(s): source_em(e, TRANSFER)[0] for s, e in sorted(evals.items())},
        "windows": per_window,
        "phase_s_median": {p: _median(rows, f"time/{p}") for p in PHASES},
        "checkpoint_bytes": json.loads(ckpt.read_text())["bytes"] if ckpt.is_file() else None,
    }


def answers(runs, warm: Mapping[str, Any], name: str, at: int) -> dict[str, Any]:
    """The protocol's two rules on one source's EM at step `at` ("incomplete" until every
    seed the rule reads has been evaluated there)."""
    per_seed = {
        arm: {
            seed: got[name][str(at)]
            for seed, got in sorted(runs.get(arm, {}).items())
            if got[name].get(str(at)) is not None
        }
        for arm in STUDY_ARMS
    }
    em = {arm: list(by_seed.values()) for arm, by_seed in per_seed.items()}
    base, se = warm[f"{name}_em"], warm[f"{name}_se"]
    out: dict[str, Any] = {
        "at_step": per_seed,
        "median": {arm: median_over_seeds(vs) for arm, vs in em.items()},
        "spread": {arm: seed_spread(vs) for arm, vs in em.items()},
    }
    grpo, llds = em[GRPO], em[LLDS]
    if len(grpo) < len(SEEDS) or base is None:
        out["grpo_improves"], out["grpo_gain"] = "incomplete", None
    else:
        gain = statistics.median(grpo) - base
        out["grpo_gain"] = gain
        out["grpo_improves"] = "yes" if gain > se and gain >= MIN_GAIN else "no"
    if len(grpo) < len(SEEDS) or len(llds) < len(SEEDS):
        out["llds_vs_grpo"] = {"verdict": "incomplete"}
        return out
    p = exact_permutation_p(llds, grpo)
    diff = statistics.median(llds) - statistics.median(grpo)
    every = min(llds) > max(grpo)
    verdict = (
        f"higher in every seed (p = {p:.2f})"
        if every and diff > MIN_GAIN
        else "no difference measured"
    )
    out["llds_vs_grpo"] = {
        "p": p,
        "median_difference": diff,
        "llds_above_grpo_in_every_seed": every,
        "verdict": verdict,
    }
    return out


def summary_markdown(s: Mapping[str, Any]) -> str:
    """`summary.md`: the answers and every seed, from `summary.json`."""
    w = s["warm_start"]
    lines = [
        "# SmolLM2-wiki LoRA study: summary",
        "",
        "Written by `run.py --tables` from the committed logs (`runs/study/`); the rules: "
        'PROTOCOL.md, "What counts as yes".',
        "",
        f"Warm start (step 0, under the runs' precision): test EM {cell(w['test_em'], '.3f')} "
        f"({w['test_n']} questions, one standard error {cell(w['test_se'], '.3f')}), transfer "
        f"EM {cell(w['transfer_em'], '.3f')} ({w['transfer_n']} questions).",
        "",
    ]
    at = str(s["step"])
    for name in ("test", "transfer"):
        lines += [f"## {name.capitalize()} EM", ""]
        steps = sorted(
            {int(k) for arm in s["runs"].values() for r in arm.values() for k in r[name]}
        )
        lines.append("| arm | seed | steps | " + " | ".join(f"EM at {k}" for k in steps) + " |")
        lines.append("|---|---|---|" + "---|" * len(steps))
        for arm, by_seed in s["runs"].items():
            for seed, r in by_seed.items():
                cells = [cell(r[name].get(str(k)), ".3f") for k in steps]
                lines.append(f"| {arm} | {seed} | {r['steps']} | " + " | ".join(cells) + " |")
        a = s[name]
        spread = "; ".join(
            f"{arm}: median {cell(sp['median'], '.3f')}, mean {cell(sp['mean'], '.3f')}"
            + (f" ± {sp['se']:.3f}" if sp["se"] is not None else "")
            for arm, sp in a["spread"].items()
        )
        lines += ["", f"At step {at} over the seeds evaluated there: {spread}."]
        gain = a["grpo_gain"]
        lines.append(
            f"GRPO improves the warm start: **{a['grpo_improves']}**"
            + (
                f" (median gain {gain:+.3f}; more than one standard error and at least "
                f"{MIN_GAIN:.2f} needed)."
                if gain is not None
                else "."
            )
        )
        v = a["llds_vs_grpo"]
        extra = (
            f" (permutation p {v['p']:.2f}, difference of medians {v['median_difference']:+.3f})"
            if "p" in v
            else ""
        )
        lines += [f"GRPO+LLDS against GRPO: **{v['verdict']}**{extra}.", ""]
    lines += ["## Per window", ""]
    lines.append(
        "| arm | seed | steps | LLD pooled share | reward | searches | entropy | k3 KL | alarms |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for arm, by_seed in s["runs"].items():
        for seed, r in by_seed.items():
            for win in r["windows"]:
                alarms = ", ".join(f"{k} {n}" for k, n in win["alarms"].items()) or "-"
                lines.append(
                    f"| {arm} | {seed} | {win['steps'][0]}-{win['steps'][1]} | "
                    f"{cell(win['lld_pooled_share'], '.3f')} ({win['lld_responses']}) | "
                    f"{cell(win['reward'], '.3f')} | {cell(win['searches'], '.2f')} | "
                    f"{cell(win['entropy'], '.3f')} | {cell(win['k3_kl_median'], '.2e')} | "
                    f"{alarms} |"
                )
    lines += ["", "## Step time (median s per phase) and checkpoint", ""]
    lines.append("| arm | seed | " + " | ".join(PHASES) + " | checkpoint MiB |")
    lines.append("|---|---|" + "---|" * (len(PHASES) + 1))
    for arm, by_seed in s["runs"].items():
        for seed, r in by_seed.items():
            size = r["checkpoint_bytes"]
            cells = [cell(r["phase_s_median"][p], ".1f") for p in PHASES]
            cells.append(cell(size / 2**20 if size else None, ".1f"))
            lines.append(f"| {arm} | {seed} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_tables(results: Path, stages: Mapping[str, Stage]) -> None:
    """`pilot.md`, `summary.json` and `summary.md`, from the committed logs alone."""
    results.mkdir(parents=True, exist_ok=True)
    with atomic_write(results / "pilot.md", "w", encoding="utf-8") as f:
        f.write(pilot_table(results, stages["pilot"]))
    summary = study_summary(results, stages["study"])
    write_json(results / "summary.json", summary, indent=1)
    with atomic_write(results / "summary.md", "w", encoding="utf-8") as f:
        f.write(summary_markdown(summary))
