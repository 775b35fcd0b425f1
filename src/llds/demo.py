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

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

TEMPLATE = "Question: {question}\n"


@dataclass
class DemoConfig:
    out: str = "runs/demo"
    seed: int = 0
    relabel_copies: int = 8
    early_answer: float = 0.5
    sft_steps: int = 1200
    sft_lr: float = 3e-3
    hidden: int = 128
    layers: int = 2
    grpo_steps: int = 50
    eval_questions: int = 120
    skip_train: bool = False


def training_config(
    run_dir: Path, out: Path, *, llds: bool, steps: int, seed: int
) -> dict[str, Any]:
    """The organism GRPO config (same as the organism preset, paths filled in)."""
    return {
        "run_dir": str(run_dir),
        "seed": seed,
        "steps": steps,
        "prompts_per_step": 8,
        "save_every": 10,
        "threads": 1,
        "model": {"path": str(out / "sft" / "model")},
        "data": {"train": str(out / "world" / "train.jsonl"), "prompt_template": TEMPLATE},
        "retriever": {"source": str(out / "world" / "corpus.jsonl"), "topk": 2},
        "rollout": {
            "group_size": 5,
            "max_turns": 3,
            "max_turn_tokens": 48,
            "max_obs_tokens": 120,
            "max_total_tokens": 768,
            "temperature": 1.0,
        },
        "algo": {
            "kl_coef": 0.001,
            "kl_kind": "low_var_kl",
            "clip_low": 0.2,
            "llds": {"enabled": llds, "coef": 0.2, "gate": "action"},
        },
        "optim": {"lr": 2.0e-4, "mini_batches": 4, "warmup_steps": 2},
        "logging": {"tensorboard": True, "progress": False},
        "diagnostics": {"on_alarm": "warn"},
    }


def _rollout_cfg():
    from llds.rollout import RolloutConfig

    return RolloutConfig(
        max_turns=3,
        max_turn_tokens=48,
        max_obs_tokens=120,
        topk=2,
        max_total_tokens=768,
        max_rows=64,
    )


def warm_start(cfg: DemoConfig, out: Path, console) -> None:
    """The target world, then `llds sft` on it and on relabeled copies of it (see `sft_args`)."""
    from llds.cli import main as cli_main
    from llds.data.world import WorldConfig, generate_world, write_world

    write_world(generate_world(WorldConfig.preset("organism", seed=cfg.seed)), out / "world")
    (out / "prompt.txt").write_text(TEMPLATE, encoding="utf-8")
    console.print(
        f"[bold]warm start[/]: expert trajectories on the world and {cfg.relabel_copies} "
        "relabeled copies (names moved to other facts), loss on every token"
    )
    if cli_main(sft_args(cfg, out)) != 0:
        raise RuntimeError(f"warm start failed; see the messages above ({out / 'sft'})")


def sft_args(cfg: DemoConfig, out: Path) -> list[str]:
    """The `llds sft` command line of the demo's warm start.

    Why this recipe: trained on its own world, a tiny model memorizes which names go with which
    relation and answers from memory; relabeled copies put the same names on other facts, so only
    copying names from the question and the passages works on all of them. Loss on every token
    (passages too) grows that copying; one token per entity name makes a copy a single step.
    `early_answer` makes the demonstrator hasty in that share of trajectories (see
    `llds.train.sft_data.early_answer_variant`): the start then knows how to search but often
    does not, and RL has a general decision to improve, not only facts to memorize.
    """
    return [
        "sft",
        "--world",
        str(out / "world"),
        "--tiny",
        "--tokenizer-vocab",
        "700",
        "--name-tokens",
        "--hidden",
        str(cfg.hidden),
        "--layers",
        str(cfg.layers),
        "--relabel-copies",
        str(cfg.relabel_copies),
        "--early-answer",
        str(cfg.early_answer),
        "--loss-on",
        "all",
        "--no-think",
        "--topk",
        "2",
        "--max-obs-tokens",
        "120",
        "--prompt-template",
        str(out / "prompt.txt"),
        "--steps",
        str(cfg.sft_steps),
        "--lr",
        str(cfg.sft_lr),
        "--batch-size",
        "16",
        "--warmup",
        "20",
        "--seed",
        str(cfg.seed),
        "--threads",
        str(min(2, os.cpu_count() or 1)),
        "--out",
        str(out / "sft"),
    ]


def evaluate_model(model_dir: Path, out: Path, result_path: Path, n: int) -> dict[str, Any]:
    from llds.data.loaders import load_examples
    from llds.io import write_json
    from llds.models.hf import load_policy
    from llds.retrieval.factory import open_retriever
    from llds.train.evaluate import evaluate

    model, tok = load_policy(model_dir)
    examples = load_examples(out / "world" / "test.jsonl", limit=n)
    retriever = open_retriever(out / "world" / "corpus.jsonl")
    res = evaluate(model, tok, retriever, examples, _rollout_cfg(), template=TEMPLATE)
    write_json(result_path, res)
    return res


def train_side_by_side(cfg: DemoConfig, out: Path, console) -> dict[str, Path]:
    """Two `llds train` processes at once (one thread each), one progress bar per run."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from llds.train.tracking import read_metrics

    runs = {"GRPO": out / "grpo", "GRPO+LLDS": out / "grpo_llds"}
    procs = {}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for label, run_dir in runs.items():
        run_dir.mkdir(parents=True, exist_ok=True)
        conf = training_config(
            run_dir, out, llds=label.endswith("LLDS"), steps=cfg.grpo_steps, seed=cfg.seed
        )
        (run_dir / "config.yaml").write_text(yaml.safe_dump(conf, sort_keys=False))
        log = (run_dir / "train.log").open("w")
        procs[label] = (
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "llds.cli",
                    "train",
                    "--config",
                    str(run_dir / "config.yaml"),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            ),
            log,
        )
    with Progress(
        TextColumn("[bold]{task.fields[label]:<10}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
    ) as bar:
        tasks = {k: bar.add_task("", total=cfg.grpo_steps, label=k) for k in runs}
        while any(p.poll() is None for p, _ in procs.values()):
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
    for label, (p, log) in procs.items():
        log.close()
        if p.returncode != 0:
            raise RuntimeError(f"{label} training failed; see {runs[label] / 'train.log'}")
    return runs


def _fmt(v: Any) -> str:
    return "-" if not isinstance(v, int | float) else f"{v:.3f}"


def run_demo(cfg: DemoConfig) -> Path:
    from rich.console import Console
    from rich.table import Table

    from llds.diagnostics.report import write_report
    from llds.train.checkpoint import latest_checkpoint

    console = Console()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    console.rule("[bold]1/4 world and warm start")
    warm_start(cfg, out, console)
    console.rule("[bold]2/4 evaluate the warm start")
    start = evaluate_model(
        out / "sft" / "model", out, out / "sft" / "eval.json", cfg.eval_questions
    )
    if cfg.skip_train:
        return out
    console.rule("[bold]3/4 GRPO and GRPO+LLDS side by side")
    runs = train_side_by_side(cfg, out, console)
    console.rule("[bold]4/4 evaluate and report")
    results = {"SFT start": start}
    for label, run_dir in runs.items():
        ckpt = latest_checkpoint(run_dir / "checkpoints")
        assert ckpt is not None
        results[label] = evaluate_model(
            ckpt / "model", out, run_dir / "eval.json", cfg.eval_questions
        )
    report = write_report(list(runs.values()), out / "report", labels=list(runs))
    table = Table(title=f"held-out EM ({cfg.eval_questions} questions, greedy)")
    for col in ("model", "EM", "1-hop", "2-hop", "3-hop", "valid searches"):
        table.add_column(col)
    summary = {}
    for label, res in results.items():
        hops = res["by_hops"]
        row = [res["overall"]["em"]] + [hops.get(h, {}).get("em", float("nan")) for h in "123"]
        summary[label] = {
            "em": res["overall"]["em"],
            "by_hops": {h: hops.get(h, {}).get("em") for h in "123"},
        }
        table.add_row(label, *[f"{v:.3f}" for v in row], f"{res['overall']['valid_searches']:.2f}")
    console.print(table)
    (out / "summary.json").write_text(
        json.dumps({"results": summary, "minutes": (time.time() - t0) / 60}, indent=2)
    )
    console.print(f"report: {report}   ({(time.time() - t0) / 60:.1f} min)")
    return report
