"""The SmolLM2-wiki LoRA study (PROTOCOL.md): its decisions, its pilot and its runs, resumable
across machines, and its tables, all from the committed logs in `results/`.

    python experiments/smollm2_wiki/warm_start.py                  # the warm start, once
    python benchmarks/smollm2_lora_step.py --steps 3 --json bench.json
    python experiments/smollm2_wiki_lora/run.py --decide-sampling bench.json   # decision 1
    python experiments/smollm2_wiki_lora/run.py --stage pilot      # decisions 2 and 3 follow
    python experiments/smollm2_wiki_lora/run.py --tables           # pilot.md, summary.*
    python experiments/smollm2_wiki_lora/run.py --stage study
    python experiments/smollm2_wiki_lora/run.py --stage study --park   # to commit, mid-run
    python experiments/smollm2_wiki_lora/run.py --stage ... --dry-run  # each run's config
    python experiments/smollm2_wiki_lora/run.py --stage ... --collect  # copy the logs only

Resumable: a run whose committed log (`results/runs/STAGE/ARM/seedN/metrics.jsonl.gz`) is
complete is skipped; an unfinished one resumes from its newest checkpoint in the work folder,
else from its parked archive (`results/parked/STAGE/ARM/seedN.tar.gz`, unpacked by itself),
else starts at step 0. Runs go in the protocol's order, `--parallel` at a time (at most two:
the protocol keeps at most two runs unfinished); one at a time runs in this process, two in
processes of their own. The pilot's rank-4 run waits for the learning rate of the three
rank-16 runs; the study refuses to start until all three decisions are recorded in
`results/decisions.json`. `--smoke` runs the same route on a tiny random model and a tiny
synthetic world (a few steps a run) into another `--results`: it checks the code, and
measures nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import gzip
import json
import math
import shutil
import statistics
import sys
import tarfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: shared modules
from _common import config_data, finished, print_dry_run, run_unfinished
from llds.analysis.pooled import summarize
from llds.analysis.seeds import seed_spread
from llds.analysis.significance import exact_permutation_p
from llds.analysis.study_logs import COMMITTED_LOG, arm_dir_name, read_committed_metrics
from llds.io import atomic_write, write_json
from llds.report.collapse import collapse_step
from llds.train.checkpoint import checkpoint_step, find_resumable
from llds_strength.run import (
    MACHINES_LOG,
    committed_steps,
    newest_config,
    note_machine,
    park,
    parked_archive,
    retire_parked,
    unpark,
)
from smollm2_wiki.answer import MIN_GAIN, TEST, TRANSFER, binomial_se
from smollm2_wiki.gpu import SMOKE_RUN, eval_data

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
PRESET = "smollm2-wiki-lora"
DECISIONS = "decisions.json"
WARM_START = "warm_start.json"
STEP0 = "step0"
"""Each stage's step-0 evaluation (every run of a stage starts from the same model: the LoRA
adapters start at zero, so rank, learning rate and LLDS do not change it)."""
INPUT_PATHS = ("model.path", "data.train", "data.eval", "retriever.source")
"""Config keys that say where the inputs are: another machine may keep them elsewhere. A
resume in this process allows them to change; the adapter records its base's fingerprint, so
another base is still refused."""
MAX_PARALLEL = 2
"""The protocol: at most two runs unfinished at a time (a parking adds at most two
checkpoints to the repository)."""

PILOT_SEED = 100
PILOT_RANK, SMALL_RANK = 16, 4
PILOT_LRS = {"lr2e-5": 2e-5, "lr5e-5": 5e-5, "lr1e-4": 1e-4}
"""The pilot's rank-16 arms, in the protocol's order (increasing rate: ties go to the lower)."""
RANK_ARM = "r4"
GRPO, LLDS = "GRPO", "GRPO+LLDS"
STUDY_ARMS = {GRPO: ("algo.llds.enabled=false",), LLDS: ("algo.llds.enabled=true",)}
SEEDS = (0, 1, 2)
K3_KEY = "mismatch/k3_kl"
K3_FLOOR = 1e-3
"""Decision 3: the median `mismatch/k3_kl` from which the study corrects the bf16 copy."""
TIS = ("algo.rollout_correction.mode=tis", "algo.rollout_correction.cap=2")
PHASES = ("rollout", "old_logprob", "ref_logprob", "update", "diagnostics", "step")
LOGS = ("alarms.jsonl", MACHINES_LOG)
ROUND = 9
"""Means are compared at 9 decimals: a mean of shares of 68 questions that ties another exactly
may differ from it in the last bit, depending on the order it was summed in."""


@dataclasses.dataclass(frozen=True)
class Stage:
    """A stage's length and how often it evaluates (the rules read the evaluations at every
    `eval_every` steps, not step 0)."""

    name: str
    steps: int
    eval_every: int

    @property
    def eval_steps(self) -> list[int]:
        return list(range(self.eval_every, self.steps + 1, self.eval_every))


STAGES = {"pilot": Stage("pilot", 30, 10), "study": Stage("study", 120, 40)}
SMOKE_STAGES = {"pilot": Stage("pilot", 2, 1), "study": Stage("study", 2, 1)}
SMOKE = (*SMOKE_RUN[1:], "data.prompt_template=Question: {question}\n", "save_every=1")
"""`--smoke`'s shrunken rollouts (the SmolLM2 study's, but its step count: each stage has its
own) and a prompt for a model without a chat template."""


@dataclasses.dataclass(frozen=True)
class Inputs:
    """Where a call finds the warm start, the questions and the search index."""

    model: str
    data: Path
    index: str
    smoke: bool = False

    @property
    def study_eval(self) -> Path:
        """The study's evaluation file: test and transfer, tagged (beside the questions, so that
        its path does not depend on the work folder)."""
        return self.data / "test_transfer" / "eval.jsonl"


def smoke_inputs(root: Path) -> Inputs:
    """A tiny synthetic world and a tiny random model standing in for trivia-wiki and the warm
    start (the same files from the same seeds on every call)."""
    from llds.data.world import WorldConfig, generate_world, write_world
    from llds.io import write_jsonl

    data, model = root / "data", root / "model"
    if not (data / "transfer.jsonl").is_file():
        world = generate_world(WorldConfig(seed=3, num_entities=40, num_train=30, num_test=12))
        write_world(world, root / "world")
        rows = [json.loads(x) for x in (root / "world" / "test.jsonl").read_text().splitlines()]
        data.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / "world" / "train.jsonl", data / "train.jsonl")
        write_jsonl(data / "dev.jsonl", rows[:4])
        write_jsonl(data / "test.jsonl", rows[4:8])
        write_jsonl(data / "transfer.jsonl", rows[8:12])
    if not (model / "config.json").is_file():
        from llds.data.world import read_world
        from llds.models.bpe import tokenizer_for_world
        from llds.models.tiny import save_tiny, tiny_causal_lm_for

        world = read_world(root / "world")
        tok = tokenizer_for_world(world, 400)
        save_tiny(tiny_causal_lm_for(tok, hidden_size=64, num_layers=2, seed=0), tok, model)
    return Inputs(str(model), data, str(root / "world" / "corpus.jsonl"), smoke=True)


# ---------------------------------------------------------------------------------- decisions


class DecisionError(SystemExit):
    """A decision that cannot be read or made: one line, naming the file."""


def read_decisions(results: Path) -> dict[str, Any]:
    path = results / DECISIONS
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DecisionError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(data, dict):
        raise DecisionError(f"{path}: expected an object of decisions")
    return data


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
    try:
        bench = json.loads(bench_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DecisionError(f"{bench_path}: not readable JSON ({e})") from None
    if not isinstance(bench, dict):
        raise DecisionError(f"{bench_path}: expected the benchmark's --json object")
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


def stage_rows(results: Path, stage: str, arm: str, seed: int) -> list[dict[str, Any]]:
    """A run's committed log rows ([] when none is committed)."""
    path = results / "runs" / stage / arm_dir_name(arm) / f"seed{seed}" / COMMITTED_LOG
    return read_committed_metrics(path) if path.is_file() else []


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
            cells = [_num(a.get("median_s", {}).get(p), ".1f") for a in arms]
            out.append(f"| {p} | " + " | ".join(cells) + " |")
        out.append(
            "| mismatch k3 KL | "
            + " | ".join(_num(a.get("mismatch_k3_kl"), ".2e") for a in arms)
            + " |"
        )
        mib = [_num((a.get("checkpoint_bytes") or 0) / 2**20, ".1f") for a in arms]
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
                f"| {arm} | {evals} | {_num(sc['mean_dev_em'], '.3f')} | {sc['out'] or '-'} |"
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


def _num(x: Any, fmt: str) -> str:
    return "-" if not isinstance(x, int | float) or isinstance(x, bool) else format(x, fmt)


# ------------------------------------------------------------------------------------- configs


def arm_overrides(stage: str, arm: str, decisions: Mapping[str, Any]) -> list[str] | None:
    """An arm's overrides of the preset, the decisions in force included; None while a
    decision it needs is missing (the pilot's r4 before the learning rate)."""
    sampling = list(decisions.get("sampling", {}).get("overrides", []))
    if stage == "pilot":
        if arm in PILOT_LRS:
            lr, rank = PILOT_LRS[arm], PILOT_RANK
        elif "learning_rate" in decisions:
            lr, rank = decisions["learning_rate"]["lr"], SMALL_RANK
        else:
            return None
        return ["algo.llds.enabled=false", f"optim.lr={lr}", *rank_overrides(rank), *sampling]
    chosen = [*decisions["learning_rate"]["overrides"], *decisions["rank"]["overrides"]]
    return [*STUDY_ARMS[arm], *chosen, *sampling, *decisions["correction"]["overrides"]]


def run_dir(work: Path, stage: str, arm: str, seed: int) -> Path:
    return work / stage / arm_dir_name(arm) / f"seed{seed}"


def run_config(
    inp: Inputs, work: Path, stage: Stage, arm: str, seed: int, arm_set: Sequence[str], threads
):
    """One run: the preset, this call's inputs, the stage's length and evaluations, the arm."""
    from llds.train.config import load_config

    evals = inp.data / "dev.jsonl" if stage.name == "pilot" else inp.study_eval
    return load_config(
        PRESET,
        [
            f"run_dir={run_dir(work, stage.name, arm, seed)}",
            f"seed={seed}",
            f"steps={stage.steps}",
            f"eval_every={stage.eval_every}",
            f"model.path={inp.model}",
            f"data.train={inp.data / 'train.jsonl'}",
            f"data.eval={evals}",
            f"retriever.source={inp.index}",
            f"threads={threads}",
            "make_inputs=null",
            "logging.tensorboard=false",
            "logging.progress=false",
            *(SMOKE if inp.smoke else ()),
            *arm_set,
        ],
    )


def ordered(stage: str, arms: Sequence[str] | None, seeds: Sequence[int] | None):
    """The protocol's order: the pilot's three rates, then r4; the study's seed 0 of both
    arms, then seed 1, then seed 2 (a study stopped early stays balanced)."""
    if stage == "pilot":
        runs = [(a, PILOT_SEED) for a in [*PILOT_LRS, RANK_ARM]]
    else:
        runs = [(a, s) for s in SEEDS for a in STUDY_ARMS]
    return [(a, s) for a, s in runs if (not arms or a in arms) and (not seeds or s in seeds)]


def plan(
    stage: Stage,
    inp: Inputs,
    work: Path,
    results: Path,
    decisions: Mapping[str, Any],
    threads: int,
    arms: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
) -> list[dict[str, Any]]:
    """Each run of the stage in order: its config (None while it waits for a decision), the
    steps its committed log holds and whether this call runs it."""
    out = []
    for arm, seed in ordered(stage.name, arms, seeds):
        done = committed_steps(results, f"{stage.name}/{arm_dir_name(arm)}", seed)
        overrides = arm_overrides(stage.name, arm, decisions)
        cfg = None
        if overrides is not None:
            cfg = run_config(inp, work, stage, arm, seed, overrides, threads)
        out.append(
            {
                "stage": stage.name,
                "arm": arm,
                "seed": seed,
                "committed_steps": done,
                "run": cfg is not None and done < stage.steps,
                "waits": None if cfg is not None else DECISION_NAMES["learning_rate"],
                "config": cfg,
            }
        )
    return out


def key(r: Mapping[str, Any]) -> tuple[str, int]:
    """A planned run as the shared park/unpark helpers name it: `(STAGE/ARM, seed)`."""
    return f"{r['stage']}/{arm_dir_name(r['arm'])}", r["seed"]


# ----------------------------------------------------------------------------------- execution


def archive_step(archive: Path) -> int | None:
    """The checkpoint step a parked archive holds (from its member names)."""
    with tarfile.open(archive, "r:gz") as tar:
        steps = [
            checkpoint_step(Path(n).parts[1])
            for n in tar.getnames()
            if n.count("/") >= 1 and n.startswith("checkpoints/")
        ]
    found = [s for s in steps if s is not None]
    return max(found) if found else None


def supersede_stale(work: Path, results: Path, todo: Sequence[Mapping[str, Any]]) -> None:
    """A work folder behind its parked archive (another machine went on from it since) is set
    aside, so that the run resumes from the archive, never from the older checkpoint."""
    for r in todo:
        src = Path(r["config"].run_dir)
        archive = parked_archive(results, *key(r))
        if not (src.is_dir() and archive.is_file()):
            continue
        here, _ = find_resumable(src / "checkpoints")
        parked = archive_step(archive)
        mine = checkpoint_step(here) if here is not None else 0
        if parked is not None and parked > (mine or 0):
            aside = src.with_name(f"{src.name}.superseded-{int(time.time())}")
            src.rename(aside)
            print(
                f"{r['arm']} seed {r['seed']}: {archive} is at step {parked}, this work folder "
                f"at {mine}; the folder is set aside as {aside.name}",
                flush=True,
            )


def prepare(runs: Sequence[dict[str, Any]], inp: Inputs, work: Path, results: Path) -> None:
    """What a run needs before its first step here: its parked state, the study's evaluation
    file, and a row naming this machine in its `machines.jsonl`."""
    todo = [r for r in runs if r["run"]]
    supersede_stale(work, results, todo)
    unpark(work, results, [key(r) for r in todo])
    if any(r["stage"] == "study" for r in todo):
        eval_data(inp.data, inp.study_eval.parent)
    for r in todo:
        cfg = r["config"]
        if r["committed_steps"] and not (Path(cfg.run_dir) / "metrics.jsonl").is_file():
            print(
                f"{r['arm']} seed {r['seed']}: no work folder nor parked state; it starts again "
                f"(its committed log of {r['committed_steps']} steps is replaced at the next "
                "collect)",
                flush=True,
            )
        note_machine(Path(cfg.run_dir), cfg.threads or 1)


def evaluate_step0(cfg: Any, out: Path) -> Path:
    """The stage's step-0 evaluation: the run's own trainer (its precision, its sampling copy)
    evaluating before any update, as the periodic evaluation does at later steps."""
    import torch

    from llds.runs.eval_result import eval_file
    from llds.train.trainer import GRPOTrainer

    done = eval_file(out, 0)
    if done.is_file():
        return done
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    step0 = dataclasses.replace(cfg, run_dir=str(out))
    trainer = GRPOTrainer(step0, resume=False)
    assert trainer.evaluator is not None, "the stages evaluate (eval_every > 0)"
    with trainer.sampler.context(trainer.precision.autocast()):
        trainer.evaluator(trainer.sampler.model, 0)
    del trainer
    gc.collect()
    return done


def train_in_process(
    configs: Sequence[Any],
    *,
    deadline: float | None = None,
    max_steps: int | None = None,
    on_checkpoint: Callable[[Any], None] | None = None,
) -> tuple[list[Any], int]:
    """Each unfinished run of `configs` in this process, in order, one step at a time, until
    `deadline` (a `time.monotonic()` value: no step is begun that the last ones of its kind,
    evaluating or not, say would end after it) or `max_steps` steps in all. A run stopped
    early saves a checkpoint at the step it reached, so that nothing it did is lost;
    `on_checkpoint(cfg)` after each checkpoint. Returns the configs not finished and the steps
    taken."""
    import torch

    from llds.evaluation.periodic import is_due
    from llds.train.lock import RunLock
    from llds.train.trainer import GRPOTrainer

    taken = 0
    for i, cfg in enumerate(configs):
        if finished(cfg):
            continue
        if taken == max_steps or (deadline is not None and time.monotonic() >= deadline):
            return list(configs[i:]), taken
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        with RunLock(cfg.run_dir):
            trainer = GRPOTrainer(cfg, resume=True, allow_config_change=INPUT_PATHS)
            took: dict[bool, list[float]] = {False: [], True: []}  # by: does it evaluate
            while trainer.step < cfg.steps:
                evaluates = is_due(trainer.step + 1, cfg.eval_every, cfg.steps)
                seen = took[evaluates][-3:] or took[False][-3:]
                guess = 1.2 * max(seen) if seen else 0.0
                if taken == max_steps or (
                    deadline is not None and time.monotonic() + guess > deadline
                ):
                    break
                started = time.monotonic()
                trainer.train(steps=1)
                took[evaluates].append(time.monotonic() - started)
                taken += 1
                if on_checkpoint is not None and _saved(cfg, trainer.step):
                    on_checkpoint(cfg)
            stopped = trainer.step < cfg.steps
            if stopped and trainer.step > 0 and not _saved(cfg, trainer.step):
                trainer.save()
                if on_checkpoint is not None:
                    on_checkpoint(cfg)
            del trainer
            gc.collect()
        if stopped:
            return list(configs[i:]), taken
    return [], taken


def _saved(cfg: Any, step: int) -> bool:
    return (Path(cfg.run_dir) / "checkpoints" / f"step_{step:06d}").is_dir()


def run_stage(
    runs: list[dict[str, Any]], inp: Inputs, work: Path, results: Path, parallel: int
) -> None:
    """The stage's step-0 evaluation when it is not committed yet, then its runs."""
    todo = [r for r in runs if r["run"]]
    if not todo:
        return
    prepare(runs, inp, work, results)
    stage = todo[0]["stage"]
    if not (results / "runs" / stage / STEP0 / "eval.json").is_file():
        evaluate_step0(todo[0]["config"], work / stage / STEP0)
        collect_eval(work / stage / STEP0, results / "runs" / stage / STEP0)
    configs = [r["config"] for r in todo]
    if parallel == 1:
        train_in_process(configs)
    else:
        run_unfinished(configs, parallel)


# --------------------------------------------------------------------------------------- logs


def collect(work: Path, results: Path, runs: Sequence[Mapping[str, Any]]) -> None:
    """Copy every started run's logs to `results/runs/STAGE/ARM/seedN/`: the per-step log
    (gzipped, the same bytes for the same log), its alarms and machines, its evaluations'
    scores (overall and per source), its resolved config and its checkpoint's size."""
    for r in runs:
        src = run_dir(work, r["stage"], r["arm"], r["seed"])
        if (src / "metrics.jsonl").is_file():
            collect_run(
                src, results / "runs" / r["stage"] / arm_dir_name(r["arm"]) / f"seed{r['seed']}"
            )


def collect_run(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    with (
        (src / "metrics.jsonl").open("rb") as f,
        atomic_write(dst / COMMITTED_LOG, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as g,
    ):
        shutil.copyfileobj(f, g)
    for name in LOGS:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)
    resolved = newest_config(src)
    if resolved is not None:
        write_json(dst / "config.json", resolved, indent=1)
    ckpt, _ = find_resumable(src / "checkpoints")
    if ckpt is not None:
        size = sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file())
        write_json(dst / "checkpoint.json", {"step": checkpoint_step(ckpt), "bytes": size})
    collect_eval(src, dst)


def collect_eval(src: Path, dst: Path) -> None:
    """The scores of every evaluation kept in `src/eval/` (overall and per data source) as
    `dst/eval.json` (the records stay behind: the scores are what the tables read)."""
    from llds.runs.eval_result import eval_files

    evals = {}
    for step, path in eval_files(src):
        data = json.loads(path.read_text(encoding="utf-8"))
        evals[str(step)] = {"overall": data["overall"], "by_source": data.get("by_source", {})}
    if evals:
        dst.mkdir(parents=True, exist_ok=True)
        write_json(dst / "eval.json", evals, indent=1)


def read_evals(path: Path) -> dict[int, dict[str, Any]]:
    if not path.is_file():
        return {}
    return {int(k): v for k, v in json.loads(path.read_text(encoding="utf-8")).items()}


def source_em(scores: Mapping[str, Any], source: str) -> tuple[float | None, int]:
    got = scores.get("by_source", {}).get(source) or {}
    return (got.get("em"), int(got.get("n", 0))) if got.get("n") else (None, 0)


# ------------------------------------------------------------------------------------- tables


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
        cells = [arm, _num(lr, "g"), str(rank), str(s.steps), _num(em0, ".3f")]
        cells += [_num(s.evals.get(k), ".3f") for k in stage.eval_steps]
        cells.append(_num(s.mean_em, ".3f"))
        cells += [_num(_mean(rows, "reward/mean", w), ".3f") for w in ws]
        cells.append(_num(_mean(rows, "rollout/valid_searches", every), ".2f"))
        cells.append(_num(_mean(rows, "policy/entropy", every), ".3f"))
        cells.append(_num(_median(rows, K3_KEY), ".2e"))
        cells.append(_num(_median(rows, "time/step"), ".1f"))
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
        "median": {arm: statistics.median(vs) if vs else None for arm, vs in em.items()},
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
        f"Warm start (step 0, under the runs' precision): test EM {_num(w['test_em'], '.3f')} "
        f"({w['test_n']} questions, one standard error {_num(w['test_se'], '.3f')}), transfer "
        f"EM {_num(w['transfer_em'], '.3f')} ({w['transfer_n']} questions).",
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
                cells = [_num(r[name].get(str(k)), ".3f") for k in steps]
                lines.append(f"| {arm} | {seed} | {r['steps']} | " + " | ".join(cells) + " |")
        a = s[name]
        spread = "; ".join(
            f"{arm}: median {_num(sp['median'], '.3f')}, mean {_num(sp['mean'], '.3f')}"
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
                    f"{_num(win['lld_pooled_share'], '.3f')} ({win['lld_responses']}) | "
                    f"{_num(win['reward'], '.3f')} | {_num(win['searches'], '.2f')} | "
                    f"{_num(win['entropy'], '.3f')} | {_num(win['k3_kl_median'], '.2e')} | "
                    f"{alarms} |"
                )
    lines += ["", "## Step time (median s per phase) and checkpoint", ""]
    lines.append("| arm | seed | " + " | ".join(PHASES) + " | checkpoint MiB |")
    lines.append("|---|---|" + "---|" * (len(PHASES) + 1))
    for arm, by_seed in s["runs"].items():
        for seed, r in by_seed.items():
            size = r["checkpoint_bytes"]
            cells = [_num(r["phase_s_median"][p], ".1f") for p in PHASES]
            cells.append(_num(size / 2**20 if size else None, ".1f"))
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


# ---------------------------------------------------------------------------------------- main


def readiness(results: Path, measured: Path) -> None:
    """The warm start's dev readiness, measured again before the pilot (`warm_start.py`
    writes it beside the warm start), kept as `results/warm_start.json`."""
    if (results / WARM_START).is_file():
        return
    if not measured.is_file():
        raise SystemExit(
            f"pilot: not started: no {results / WARM_START} and no {measured} to copy; measure "
            "the warm start first: python experiments/smollm2_wiki/warm_start.py"
        )
    results.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(measured, results / WARM_START)
    print(f"warm start readiness: {measured} kept as {results / WARM_START}", flush=True)


def arguments() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--stage", choices=list(STAGES), help="the runs to plan")
    p.add_argument("--work", type=Path, default=Path("runs/smollm2_wiki_lora"))
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--model", default="runs/smollm2-wiki-rl/sft/model", help="the warm start")
    p.add_argument("--data", type=Path, default=Path("data/trivia-wiki"))
    p.add_argument("--index", default="indexes/wiki", help="BM25 index of the summaries")
    p.add_argument(
        "--readiness",
        type=Path,
        default=Path("runs/smollm2-wiki-rl/sft/readiness.json"),
        help="warm_start.py's measurement, kept as RESULTS/warm_start.json before the pilot",
    )
    p.add_argument("--arms", nargs="+", default=None, help="only these arms (default: all)")
    p.add_argument("--seeds", nargs="+", type=int, default=None, help="only these seeds")
    p.add_argument("--parallel", type=int, default=1, help="runs at a time (1 or 2)")
    p.add_argument("--threads", type=int, default=2, help="torch threads per run")
    p.add_argument("--dry-run", action="store_true", help="print each run's config; run nothing")
    p.add_argument("--collect", action="store_true", help="only copy the logs and decide")
    p.add_argument("--park", action="store_true", help="archive unfinished runs, to commit")
    p.add_argument("--tables", action="store_true", help="write pilot.md and summary.*")
    p.add_argument("--decide-sampling", type=Path, default=None, metavar="BENCH_JSON")
    p.add_argument("--smoke", action="store_true", help="tiny model and world; measures nothing")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    ap = arguments()
    args = ap.parse_args(argv)
    results, work = args.results, args.work
    if args.smoke and results.resolve() == RESULTS.resolve():
        ap.error("--smoke: give another --results (the committed results are the study's)")
    if not 1 <= args.parallel <= MAX_PARALLEL:
        ap.error("--parallel: 1 or 2 (the protocol keeps at most two runs unfinished at a time)")
    stages = SMOKE_STAGES if args.smoke else STAGES
    if args.decide_sampling is not None:
        made = decide_sampling(results, args.decide_sampling)
        print(f"decision 1: {made['name']} (overrides: {' '.join(made['overrides']) or 'none'})")
    if args.tables:
        derive_decisions(results, stages["pilot"])
        write_tables(results, stages)
        print(f"tables written to {results}")
    if args.stage is None:
        if args.decide_sampling is None and not args.tables:
            ap.error("--stage, --decide-sampling or --tables")
        return
    stage = stages[args.stage]
    known = ordered(stage.name, None, None)
    for given, have, what in (
        (args.arms, {a for a, _ in known}, "--arms"),
        (args.seeds, {s for _, s in known}, "--seeds"),
    ):
        if given and set(given) - have:
            ap.error(f"{what}: {args.stage} has {', '.join(map(str, sorted(have)))}")
    inp = (
        smoke_inputs(work / "smoke-inputs")
        if args.smoke
        else Inputs(args.model, args.data, args.index)
    )
    for _ in range(2):  # the pilot's r4 is planned once the three it waits for are complete
        decisions = derive_decisions(results, stages["pilot"])
        refuse_without_decisions(stage.name, decisions, results)
        runs = plan(stage, inp, work, results, decisions, args.threads, args.arms, args.seeds)
        if args.dry_run:
            print_dry_run(
                [{**r, "config": config_data(r["config"]) if r["config"] else None} for r in runs]
            )
            return
        started = [r for r in runs if r["config"] is not None]
        if args.park:
            park(work, results, [key(r) for r in runs if r["run"]])
            collect(work, results, started)
            retire_parked(results, [{**r, "arm": key(r)[0]} for r in started])
            derive_decisions(results, stages["pilot"])
            return
        if not args.collect:
            if stage.name == "pilot" and not inp.smoke:
                readiness(results, args.readiness)
            if not inp.smoke and not Path(inp.model).exists():
                raise SystemExit(
                    f"{inp.model}: no warm start there; build it with python "
                    "experiments/smollm2_wiki/warm_start.py"
                )
            run_stage(runs, inp, work, results, args.parallel)
        collect(work, results, started)
        retire_parked(results, [{**r, "arm": key(r)[0]} for r in started])
        waiting = [r for r in runs if r["config"] is None]
        if args.collect or not waiting:
            break
    derive_decisions(results, stages["pilot"])


if __name__ == "__main__":
    main()
