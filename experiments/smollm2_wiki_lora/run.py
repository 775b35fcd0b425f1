"""The SmolLM2-wiki LoRA study (PROTOCOL.md): its decisions, its pilot and its runs, resumable
across machines, and its tables, all from the committed logs in `results/`.

    python experiments/smollm2_wiki/warm_start.py --lora-r 16 --lr 2e-4 \\
        --sft-out experiments/smollm2_wiki_lora/warm_start      # the warm start, once
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
import shutil
import sys
import tarfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: shared modules
from _common import config_data, finished, print_dry_run, run_unfinished
from llds.analysis.study_logs import COMMITTED_LOG, arm_dir_name
from llds.io import atomic_write, write_json
from llds.policy.lora import ADAPTER_DIR
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
from smollm2_wiki.gpu import SMOKE_RUN, eval_data
from smollm2_wiki_lora.decisions import (
    ADOPT_EM,
    DECISION_NAMES,
    decide_sampling,
    derive_decisions,
    rank_overrides,
    refuse_without_decisions,
    warm_start_adopted,
)
from smollm2_wiki_lora.protocol import (
    PILOT_LRS,
    PILOT_RANK,
    PRESET,
    SMALL_RANK,
    SMOKE_STAGES,
    STAGES,
    STEP0,
    STUDY_ARMS,
    Stage,
    ordered,
)
from smollm2_wiki_lora.tables import write_tables

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
WARM_DIR = HERE / "warm_start"
"""Amendment 1: the committed LoRA warm start (`adapter/`) and its dev readiness."""
WARM_START_COMMAND = (
    "python experiments/smollm2_wiki/warm_start.py --lora-r 16 --lr 2e-4 "
    "--sft-out experiments/smollm2_wiki_lora/warm_start"
)
WARM_START = "warm_start.json"
INPUT_PATHS = ("model.path", "data.train", "data.eval", "retriever.source")
"""Config keys that say where the inputs are: another machine may keep them elsewhere. A
resume in this process allows them to change; the adapter records its base's fingerprint, so
another base is still refused."""
MAX_PARALLEL = 2
"""The protocol: at most two runs unfinished at a time (a parking adds at most two
checkpoints to the repository)."""
LOGS = ("alarms.jsonl", MACHINES_LOG)
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


# ---------------------------------------------------------------------------------------- main


def readiness(results: Path, measured: Path) -> None:
    """The warm start's dev readiness, measured again before the pilot (`warm_start.py`
    writes it beside the warm start), kept as `results/warm_start.json`."""
    if (results / WARM_START).is_file():
        return
    if not measured.is_file():
        raise SystemExit(
            f"pilot: not started: no {results / WARM_START} and no {measured} to copy; measure "
            f"the warm start first: {WARM_START_COMMAND}"
        )
    record = json.loads(measured.read_text(encoding="utf-8"))
    if str(record.get("model", "")).endswith(ADAPTER_DIR) and not warm_start_adopted(
        record, str(measured)
    ):
        em = record["readiness"]["em"]
        raise SystemExit(
            f"pilot: not started: the LoRA warm start in {measured.parent} has greedy dev EM "
            f"{em:.3f}, below amendment 1's {ADOPT_EM}; build the second candidate (--lr 1e-4) "
            "or give the full warm start (--model, --readiness)"
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
    p.add_argument("--model", default=str(WARM_DIR / ADAPTER_DIR), help="the warm start")
    p.add_argument("--data", type=Path, default=Path("data/trivia-wiki"))
    p.add_argument("--index", default="indexes/wiki", help="BM25 index of the summaries")
    p.add_argument(
        "--readiness",
        type=Path,
        default=WARM_DIR / "readiness.json",
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
                    f"{inp.model}: no warm start there; build it with {WARM_START_COMMAND}"
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
