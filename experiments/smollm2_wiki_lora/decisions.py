"""The study's three decisions (PROTOCOL.md, decisions 1-3): the pure rules that make them
from the benchmark's figures and the committed pilot logs, and their record in
`results/decisions.json` and `decisions.md`, which the study refuses to start without. Kept
apart from the driver so that the rules can be read, and tested, on their own."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from llds.io import atomic_write, write_json
from llds.report.collapse import collapse_step
from smollm2_wiki_lora.protocol import (
    K3_KEY,
    PHASES,
    PILOT_LRS,
    PILOT_RANK,
    PILOT_SEED,
    PRESET,
    RANK_ARM,
    SMALL_RANK,
    Stage,
    cell,
    stage_rows,
)

DECISIONS = "decisions.json"
ADOPT_EM = 0.143
"""Amendment 1: the greedy dev EM a LoRA warm start needs to replace the full one (its 0.191
less one binomial standard error at n = 68)."""
K3_FLOOR = 1e-3
"""Decision 3: the median `mismatch/k3_kl` from which the study corrects the bf16 copy."""
TIS = ("algo.rollout_correction.mode=tis", "algo.rollout_correction.cap=2")
ROUND = 9
"""Means are compared at 9 decimals: a mean of shares of 68 questions that ties another exactly
may differ from it in the last bit, depending on the order it was summed in."""


class DecisionError(SystemExit):
    """A decision that cannot be read or made: one line, naming the file."""


def read_decisions(results: Path) -> dict[str, Any]:
    path = results / DECISIONS
    if not path.is_file():
        return {}
    return _json_object(path, "an object of decisions")


def _json_object(path: Path, what: str) -> dict[str, Any]:
    """The JSON object in `path`, or one line naming the file and what it should hold."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DecisionError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(data, dict):
        raise DecisionError(f"{path}: expected {what}")
    return data


def warm_start_adopted(measured: Mapping[str, Any], where: str) -> bool:
    """Amendment 1's rule on a LoRA warm start's dev readiness (`warm_start.py`'s JSON): is its
    greedy EM at least `ADOPT_EM`? A full warm start (no adapter) is the protocol's own and
    needs no rule."""
    em = (measured.get("readiness") or {}).get("em")
    if not isinstance(em, int | float):
        raise DecisionError(f"{where}: no readiness.em (write it with warm_start.py)")
    if measured.get("split") != "dev":
        raise DecisionError(f"{where}: measured on {measured.get('split')!r}; the rule reads dev")
    return round(em, ROUND) >= ADOPT_EM


def sampling_decision(bench: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Decision 1 from the benchmark's `--json` figures: the LoRA arm (an arm on this study's
    preset) with the shortest median step; equal medians go to the arm listed first."""
    arms = bench.get("arms")
    if not isinstance(arms, list) or not arms:
        raise DecisionError(f"{where}: no 'arms' list (write it with --json)")
    lora = []
    for i, arm in enumerate(arms):
        if not isinstance(arm, dict):
            raise DecisionError(f"{where}: arms[{i}] is not an object")
        step = (arm.get("median_s") or {}).get("step")
        overrides = arm.get("overrides")
        if not isinstance(step, int | float) or not isinstance(overrides, list):
            raise DecisionError(f"{where}: arms[{i}] needs median_s.step and overrides")
        if arm.get("preset") == PRESET:
            lora.append(arm)
    if not lora:
        raise DecisionError(f"{where}: no arm on the {PRESET} preset (no LoRA arm measured)")
    best = min(lora, key=lambda a: float(a["median_s"]["step"]))  # min keeps the first of ties
    overrides = [str(o) for o in best["overrides"]]
    return {
        "arm": best.get("arm"),
        "name": best.get("name"),
        "overrides": overrides,
        "bf16_copy": any(o.startswith("rollout.dtype=") for o in overrides),
        "median_step_s": float(best["median_s"]["step"]),
        "rule": "the LoRA arm with the shortest median step (PROTOCOL.md, decision 1)",
        "benchmark": dict(bench),
    }


def decide_sampling(results: Path, bench_path: Path) -> dict[str, Any]:
    """Record decision 1 from `bench_path`; an existing, different decision 1 is kept and the
    call refused (the protocol fixes each decision once)."""
    bench = _json_object(bench_path, "the benchmark's --json object")
    made = sampling_decision(bench, str(bench_path))
    decisions = read_decisions(results)
    if "sampling" in decisions and decisions["sampling"] != made:
        raise DecisionError(
            f"{results / DECISIONS}: decision 1 is recorded already "
            f"({decisions['sampling'].get('name')}); it is not changed"
        )
    decisions["sampling"] = made
    write_decisions(results, decisions)
    return made


@dataclasses.dataclass(frozen=True)
class PilotScore:
    """One pilot run read by decision 2's rule."""

    arm: str
    steps: int
    evals: dict[int, float]
    """dev EM at each of the stage's evaluation steps logged"""
    collapse: int | None
    skipped: int
    complete: bool

    @property
    def mean_em(self) -> float | None:
        """Mean dev EM over the stage's evaluations (None until every one is logged)."""
        return statistics.fmean(self.evals.values()) if self.complete else None

    @property
    def out(self) -> str | None:
        """Why the rule leaves the run out, or None."""
        if self.collapse is not None:
            return f"its reward collapsed at step {self.collapse}"
        if self.skipped:
            return f"it skipped {self.skipped} update(s) for a non-finite loss"
        return None


def pilot_score(arm: str, rows: Sequence[Mapping[str, Any]], stage: Stage) -> PilotScore:
    """A pilot run's evaluations, collapse (`llds.report.collapse`) and skipped updates."""
    evals = {int(r["step"]): float(r["eval/em"]) for r in rows if "eval/em" in r}
    evals = {s: evals[s] for s in stage.eval_steps if s in evals}
    rewarded = [r for r in rows if isinstance(r.get("reward/mean"), int | float)]
    collapse = collapse_step(
        [int(r["step"]) for r in rewarded], [float(r["reward/mean"]) for r in rewarded]
    )
    skipped = max((int(r.get("optim/skipped_total") or 0) for r in rows), default=0)
    last = max((int(r["step"]) for r in rows), default=0)
    complete = last >= stage.steps and len(evals) == len(stage.eval_steps)
    return PilotScore(arm, last, evals, collapse, skipped, complete)


def choose_lr(scores: Mapping[str, PilotScore]) -> str | None:
    """Decision 2's learning rate: the rank-16 arm with the highest mean dev EM, runs that
    collapsed or skipped an update out, equal means to the lower rate; None when every run is
    out. Call it once all three are complete."""
    best, best_em = None, -math.inf
    for arm in sorted(PILOT_LRS, key=PILOT_LRS.__getitem__):
        s = scores[arm]
        if s.out is None and s.mean_em is not None and round(s.mean_em, ROUND) > best_em:
            best, best_em = arm, round(s.mean_em, ROUND)
    return best


def choose_rank(rank16: PilotScore, rank4: PilotScore) -> int:
    """Decision 2's rank: 4 when its mean dev EM is at least rank 16's at the chosen rate (a
    rank-4 run that collapsed or skipped an update is out), else 16."""
    if rank4.out is not None or rank4.mean_em is None or rank16.mean_em is None:
        return PILOT_RANK
    return SMALL_RANK if round(rank4.mean_em, ROUND) >= round(rank16.mean_em, ROUND) else PILOT_RANK


def median_k3(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """The median over a run's steps of `mismatch/k3_kl` (None where none is logged)."""
    values = [float(r[K3_KEY]) for r in rows if isinstance(r.get(K3_KEY), int | float)]
    return statistics.median(values) if values else None


def correction_decision(sampling: Mapping[str, Any], run: str, k3: float | None) -> dict:
    """Decision 3: truncated importance sampling (cap 2) when decision 1 chose a bf16 sampling
    copy and the chosen pilot run's median k3 KL is at least 1e-3; else none."""
    if not sampling.get("bf16_copy"):
        why = "decision 1 chose no bf16 sampling copy: nothing to correct"
        return {"applies": False, "pilot_run": run, "k3_kl_median": k3, "overrides": [], "why": why}
    if k3 is None:
        raise DecisionError(
            f"decision 3: the pilot run {run} sampled from a bf16 copy but logged no {K3_KEY}"
        )
    applies = k3 >= K3_FLOOR
    return {
        "applies": applies,
        "pilot_run": run,
        "k3_kl_median": k3,
        "overrides": list(TIS) if applies else [],
        "why": f"median {K3_KEY} {k3:.3g} {'>=' if applies else '<'} {K3_FLOOR:g}",
    }


def rank_overrides(rank: int) -> list[str]:
    return [f"model.lora.r={rank}", f"model.lora.alpha={2 * rank}"]


def pilot_scores(results: Path, stage: Stage) -> dict[str, PilotScore]:
    arms = [*PILOT_LRS, RANK_ARM]
    return {a: pilot_score(a, stage_rows(results, "pilot", a, PILOT_SEED), stage) for a in arms}


def derive_decisions(results: Path, pilot: Stage) -> dict[str, Any]:
    """Decisions 2 and 3 as the committed pilot logs make them, added to those recorded, each
    once its runs are complete; a recorded one whose choice the logs now contradict stops the
    call (one line), and the later ones are made from the recorded ones."""
    decisions = read_decisions(results)
    made = dict(decisions)
    scores = pilot_scores(results, pilot)
    table = {
        a: {"evals": {str(k): v for k, v in s.evals.items()}, "mean_dev_em": s.mean_em}
        | {"out": s.out, "steps": s.steps}
        for a, s in scores.items()
    }

    def settle(name: str, record: dict[str, Any]) -> None:
        if name not in made:
            made[name] = record
        elif made[name]["overrides"] != record["overrides"]:
            raise DecisionError(
                f"{results / DECISIONS}: the recorded {name} decision ({made[name]['overrides']}) "
                f"differs from what the committed pilot logs give now ({record['overrides']}); "
                "the logs changed after it was made"
            )

    if all(scores[a].complete for a in PILOT_LRS):
        arm = choose_lr(scores)
        if arm is None:
            print("decision 2: every rank-16 pilot run is out; no learning rate", flush=True)
        else:
            lr = PILOT_LRS[arm]
            rule = "highest mean dev EM over the evaluations after step 0; a run that collapsed "
            rule += "or skipped an update is out; equal means: the lower rate"
            settle(
                "learning_rate",
                {
                    "arm": arm,
                    "lr": lr,
                    "overrides": [f"optim.lr={lr}"],
                    "scores": {a: table[a] for a in PILOT_LRS},
                    "rule": rule,
                },
            )
    lr_arm = made.get("learning_rate", {}).get("arm")
    if lr_arm in scores and scores[RANK_ARM].complete:
        rank = choose_rank(scores[lr_arm], scores[RANK_ARM])
        settle(
            "rank",
            {
                "rank": rank,
                "overrides": rank_overrides(rank),
                "pilot_run": RANK_ARM if rank == SMALL_RANK else lr_arm,
                "scores": {lr_arm: table[lr_arm], RANK_ARM: table[RANK_ARM]},
                "rule": "rank 4 when its mean dev EM is at least rank 16's at the chosen rate",
            },
        )
    run = made.get("rank", {}).get("pilot_run")
    if run in scores and "sampling" in made and scores[run].complete:
        k3 = median_k3(stage_rows(results, "pilot", run, PILOT_SEED))
        settle("correction", correction_decision(made["sampling"], run, k3))
    if made != decisions:
        write_decisions(results, made)
    return made


def missing_decisions(stage: str, decisions: Mapping[str, Any]) -> list[str]:
    need = ["sampling"] if stage == "pilot" else ["sampling", "learning_rate", "rank"]
    if stage == "study":
        need.append("correction")
    return [k for k in need if k not in decisions]


DECISION_NAMES = {
    "sampling": "decision 1 (the sampling setting, from the benchmark: --decide-sampling "
    "BENCH.json)",
    "learning_rate": "decision 2's learning rate (the three rank-16 pilot runs)",
    "rank": "decision 2's rank (the pilot's r4 run)",
    "correction": "decision 3 (the mismatch correction, after the pilot)",
}


def refuse_without_decisions(stage: str, decisions: Mapping[str, Any], results: Path) -> None:
    missing = missing_decisions(stage, decisions)
    if missing:
        raise DecisionError(
            f"{stage}: not started: {results / DECISIONS} has no "
            + "; no ".join(DECISION_NAMES[k] for k in missing)
        )


def write_decisions(results: Path, decisions: Mapping[str, Any]) -> None:
    results.mkdir(parents=True, exist_ok=True)
    write_json(results / DECISIONS, dict(decisions))
    with atomic_write(results / "decisions.md", "w", encoding="utf-8") as f:
        f.write(decisions_markdown(decisions))


def decisions_markdown(d: Mapping[str, Any]) -> str:
    """`decisions.md`: each decision recorded, its figures and its rule."""
    out = ["# SmolLM2-wiki LoRA study: decisions", ""]
    out += ["Written by `run.py` from `decisions.json` (PROTOCOL.md, decisions 1-3).", ""]
    s = d.get("sampling")
    out.append("## Decision 1: the sampling setting")
    if s is None:
        out += ["", "Not recorded yet.", ""]
    else:
        bench = s.get("benchmark", {})
        arms = bench.get("arms", [])
        out += ["", f"Machine: {bench.get('machine')}; command: `{bench.get('command')}`.", ""]
        out.append("| phase (median s) | " + " | ".join(str(a.get("name")) for a in arms) + " |")
        out.append("|---|" + "---|" * len(arms))
        for p in PHASES:
            cells = [cell(a.get("median_s", {}).get(p), ".1f") for a in arms]
            out.append(f"| {p} | " + " | ".join(cells) + " |")
        out.append(
            "| mismatch k3 KL | "
            + " | ".join(cell(a.get("mismatch_k3_kl"), ".2e") for a in arms)
            + " |"
        )
        mib = [cell((a.get("checkpoint_bytes") or 0) / 2**20, ".1f") for a in arms]
        out.append("| checkpoint (MiB) | " + " | ".join(mib) + " |")
        shown = " ".join(s["overrides"]) or "none: the preset as committed"
        out += [
            "",
            f"**Chosen: {s.get('name')}** (median step {s['median_step_s']:.1f} s; "
            f"overrides: {shown}); {s['rule']}.",
            "",
        ]
    out.append("## Decision 2: learning rate and rank")
    lr, rank = d.get("learning_rate"), d.get("rank")
    if lr is None:
        out += ["", "Not recorded yet (the three rank-16 pilot runs are not complete).", ""]
    else:
        out += ["", "| pilot run | dev EM per evaluation | mean | out |", "|---|---|---|---|"]
        scores = {**lr["scores"], **(rank or {}).get("scores", {})}
        for arm, sc in scores.items():
            evals = ", ".join(f"{v:.3f} ({k})" for k, v in sc["evals"].items())
            out.append(
                f"| {arm} | {evals} | {cell(sc['mean_dev_em'], '.3f')} | {sc['out'] or '-'} |"
            )
        out += ["", f"**Learning rate: {lr['lr']:g}** ({lr['arm']}); {lr['rule']}."]
        if rank is None:
            out += ["", "Rank: not recorded yet (the r4 run is not complete).", ""]
        else:
            out += ["", f"**Rank: {rank['rank']}**; {rank['rule']}.", ""]
    c = d.get("correction")
    out.append("## Decision 3: the mismatch correction")
    if c is None:
        out += ["", "Not recorded yet.", ""]
    else:
        chosen = "truncated importance sampling, cap 2" if c["applies"] else "none"
        out += ["", f"**{chosen}** (pilot run {c['pilot_run']}: {c['why']}).", ""]
    return "\n".join(out)
