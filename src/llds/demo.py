"""The main job on the embedded default: the organism world, a warm start, GRPO vs GRPO+LLDS.

1. Build the target world (fictional entities, a passage corpus, 1-3 hop questions).
2. Warm-start a tiny Qwen2 with SFT on expert search trajectories of its training questions and
   of relabeled copies of the world (the same names attached to other facts), so memorizing facts
   cannot work and the model has to learn the protocol and copying names from what it reads. In
   half of the trajectories the demonstrator stops searching early and answers with the last name
   it read, as an untrained model answers before it has looked things up.
3. Train GRPO and GRPO+LLDS from the same start and seed, side by side (one process each): they
   have to learn when to keep searching, which is what carries over to held-out questions.
4. Evaluate the start and both results greedily on held-out questions; write the report.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from llds.config.schema import section

if TYPE_CHECKING:
    from llds.runs.eval_result import EvalResult
    from llds.sft import SFTConfig
    from llds.train.config import TrainConfig

TEMPLATE = "Question: {question}\n"


@section
class DemoConfig:
    """`llds demo`: the demo's knobs; null takes the value of the `sft-demo` / `organism`
    presets."""

    out: str = "runs/demo"
    """output directory: world/, sft/, grpo/, grpo_llds/, report/"""
    seed: int = 0
    """seed of the world, the warm start and both runs"""
    relabel_copies: int | None = Field(default=None, ge=0)
    """relabeled copies of the world in the warm start (sft-demo: 8)"""
    early_answer: float | None = Field(default=None, ge=0, le=1)
    """share of warm-start trajectories that stop searching early (sft-demo: 0.5)"""
    sft_steps: int | None = Field(default=None, ge=1)
    """warm-start SFT steps (sft-demo: 1200)"""
    hidden: int | None = Field(default=None, ge=1)
    """hidden size of the tiny model (sft-demo: 128)"""
    layers: int | None = Field(default=None, ge=1)
    """layers of the tiny model (sft-demo: 2)"""
    grpo_steps: int = Field(default=50, ge=1)
    """training steps of each GRPO run"""
    eval_questions: int = Field(default=120, ge=1)
    """held-out questions in the final evaluation"""
    skip_train: bool = False
    """stop after the warm start"""


def sft_config(cfg: DemoConfig, out: Path) -> SFTConfig:
    """The warm start: the `sft-demo` preset with this demo's world, output and overrides."""
    from llds.sft import load_sft_config

    given = {
        "world": str(out / "world"),
        "out": str(out / "sft"),
        "prompt_template": str(out / "prompt.txt"),
        "seed": cfg.seed,
        "threads": min(2, os.cpu_count() or 1),
        "relabel_copies": cfg.relabel_copies,
        "early_answer": cfg.early_answer,
        "steps": cfg.sft_steps,
        "hidden": cfg.hidden,
        "layers": cfg.layers,
    }
    return load_sft_config("sft-demo", {k: v for k, v in given.items() if v is not None})


def training_config(run_dir: Path, out: Path, *, llds: bool, steps: int, seed: int) -> TrainConfig:
    """A GRPO run of the demo: the `organism` preset with this demo's paths, length and seed,
    checkpoints every 10 steps and no periodic evaluation (the demo evaluates at the end)."""
    from llds.train.config import load_config

    return load_config(
        "organism",
        [
            f"run_dir={run_dir}",
            f"seed={seed}",
            f"steps={steps}",
            "save_every=10",
            "eval_every=0",
            "logging.progress=false",
            f"model.path={out / 'sft' / 'model'}",
            f"data.train={out / 'world' / 'train.jsonl'}",
            f"data.eval={out / 'world' / 'test.jsonl'}",
            f"retriever.source={out / 'world' / 'corpus.jsonl'}",
            f"algo.llds.enabled={'true' if llds else 'false'}",
        ],
    )


def organism_rollout():
    """The organism preset's rollout limits with its retriever's top-k: what the demo's
    evaluations (and the studies that evaluate its warm start) sample with. Read from the
    preset, so that the two cannot drift apart."""
    import dataclasses

    from llds.train.config import load_config

    preset = load_config("organism")
    return dataclasses.replace(preset.rollout, topk=preset.retriever.topk)


def warm_start(cfg: DemoConfig, out: Path, console) -> None:
    """The target world, then the warm start on it and on relabeled copies of it."""
    from llds import sft
    from llds.data.world import WorldConfig, generate_world, write_world

    write_world(generate_world(WorldConfig.preset("organism", seed=cfg.seed)), out / "world")
    (out / "prompt.txt").write_text(TEMPLATE, encoding="utf-8")
    sft_cfg = sft_config(cfg, out)
    console.print(
        f"[bold]warm start[/]: expert trajectories on the world and {sft_cfg.relabel_copies} "
        "relabeled copies (names moved to other facts), loss on every token"
    )
    sft.run(sft_cfg)


def evaluate_model(model_dir: Path, out: Path, result_path: Path, n: int) -> EvalResult:
    from llds.data.loaders import load_examples
    from llds.evaluation.evaluate import evaluate
    from llds.models.hf import load_policy
    from llds.retrieval.factory import open_retriever

    model, tok = load_policy(model_dir)
    examples = load_examples(out / "world" / "test.jsonl", limit=n)
    retriever = open_retriever(out / "world" / "corpus.jsonl")
    res = evaluate(model, tok, retriever, examples, organism_rollout(), template=TEMPLATE)
    res.write(result_path)
    return res


def train_side_by_side(cfg: DemoConfig, out: Path, console) -> dict[str, Path]:
    """Both GRPO runs at once, each `llds.train.run` in its own process (one thread each), one
    progress bar per run."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from llds.config.loader import to_dict
    from llds.io import write_yaml
    from llds.runs.tracking import read_metrics
    from llds.train.background import start_run

    runs = {"GRPO": out / "grpo", "GRPO+LLDS": out / "grpo_llds"}
    procs = {}
    for label, run_dir in runs.items():
        run_dir.mkdir(parents=True, exist_ok=True)
        conf = training_config(
            run_dir, out, llds=label.endswith("LLDS"), steps=cfg.grpo_steps, seed=cfg.seed
        )
        write_yaml(run_dir / "config.yaml", to_dict(conf))  # the exact config, to rerun by hand
        procs[label] = start_run(conf, run_dir / "train.log")
    with Progress(
        TextColumn("[bold]{task.fields[label]:<10}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
    ) as bar:
        tasks = {k: bar.add_task("", total=cfg.grpo_steps, label=k) for k in runs}
        while any(p.is_alive() for p in procs.values()):
            for label, run_dir in runs.items():
                rows = read_metrics(run_dir)
                if rows:
                    r = rows[-1]
                    bar.update(
                        tasks[label],
                        completed=r["step"],
                        description=f"reward {r.get('reward/mean', 0):.2f}  "
                        f"logp+ {_fmt(r.get('lld/logp_correct'))}",
                    )
            time.sleep(1.0)
        for label, run_dir in runs.items():
            bar.update(tasks[label], completed=len(read_metrics(run_dir)))
    for label, p in procs.items():
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"{label} training failed; see {runs[label] / 'train.log'}")
    return runs


def _fmt(v: Any) -> str:
    return "-" if not isinstance(v, int | float) else f"{v:.3f}"


def final_checkpoint(run_dir: Path) -> Path:
    """The run's newest checkpoint that passes its manifest check (the one evaluated); a
    damaged newer one is passed over, and none at all is an error naming what was wrong."""
    from llds.errors import UserInputError
    from llds.train.checkpoint import find_resumable

    ckpt, damaged = find_resumable(run_dir / "checkpoints")
    if ckpt is None:
        why = "; ".join(f"{p.name}: {reason}" for p, reason in damaged) or "none written"
        raise UserInputError(f"{run_dir / 'checkpoints'}: no intact checkpoint ({why})")
    return ckpt


def run_demo(cfg: DemoConfig) -> Path:
    from rich.console import Console
    from rich.table import Table

    from llds.io import write_json
    from llds.report.html import write_report
    from llds.runs.eval_result import eval_file

    console = Console()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    console.rule("[bold]1/4 world and warm start")
    warm_start(cfg, out, console)
    console.rule("[bold]2/4 evaluate the warm start")
    start = evaluate_model(
        out / "sft" / "model", out, eval_file(out / "sft", 0), cfg.eval_questions
    )
    if cfg.skip_train:
        return out
    console.rule("[bold]3/4 GRPO and GRPO+LLDS side by side")
    runs = train_side_by_side(cfg, out, console)
    console.rule("[bold]4/4 evaluate and report")
    results = {"SFT start": start}
    for label, run_dir in runs.items():
        ckpt = final_checkpoint(run_dir)
        results[label] = evaluate_model(
            ckpt / "model", out, eval_file(run_dir, cfg.grpo_steps), cfg.eval_questions
        )
    report = write_report(list(runs.values()), out / "report", labels=list(runs))
    table = Table(title=f"held-out EM ({cfg.eval_questions} questions, greedy)")
    for col in ("model", "EM", "1-hop", "2-hop", "3-hop", "valid searches"):
        table.add_column(col)
    summary = {}
    for label, res in results.items():
        hops = res.em_by_hops("123")
        row = [res.overall.em, *hops.values()]
        summary[label] = {
            "em": res.overall.em,
            "by_hops": {h: None if math.isnan(v) else v for h, v in hops.items()},
        }
        table.add_row(label, *[f"{v:.3f}" for v in row], f"{res.overall.valid_searches:.2f}")
    console.print(table)
    write_json(out / "summary.json", {"results": summary, "minutes": (time.time() - t0) / 60})
    console.print(f"report: {report}   ({(time.time() - t0) / 60:.1f} min)")
    return report
