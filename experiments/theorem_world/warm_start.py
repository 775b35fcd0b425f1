"""Warm-start a tiny model on the theorem world and measure it before any RL.

Makes the `world-theorem` world, trains the `sft-theorem` warm start (loss on actions, thinking
text from the paraphrase bank) in segments of `--check-every` steps, and after each segment
samples groups of training questions at the sampling temperature. It stops at the first
checkpoint whose sampled accuracy is at least 0.5 and whose entropy is at least 0.3 nats per
model token (`warm_start_report.py`), measures that model in full (probe included) and writes
`report.json` and `warm_start.md` to `--results`; the model goes to `--work`/model.

Each segment is its own `sft_train` call (a fresh AdamW, warm-up then cosine decay over the
segment, a shuffle seeded by the segment's index): the checks need the model between segments.

    python experiments/theorem_world/warm_start.py --work runs/theorem_world
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: the studies' modules
from llds.analysis.machine import cpu_name, machine
from llds.data.world import WorldConfig, generate_world, write_world
from llds.io import write_json
from llds.models.tiny import save_tiny
from llds.retrieval.factory import build_retriever
from llds.rollout import RolloutConfig
from llds.sft import tiny_model_and_tokenizer
from llds.sft.config import load_sft_config
from llds.sft.data import build_expert_episodes, think_entropy
from llds.sft.trainer import sft_train
from llds.train.checkpoint import file_sha256
from theorem_world.warm_start_report import markdown_table, measure_warm_start

HERE = Path(__file__).resolve().parent


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", default="runs/theorem_world", help="world and model folder")
    p.add_argument("--results", default=str(HERE / "results"), help="report folder")
    p.add_argument("--check-every", type=int, default=150, help="SFT steps between checks")
    p.add_argument("--max-steps", type=int, default=None, help="default: the preset's steps")
    p.add_argument("--check-questions", type=int, default=32, help="questions per check")
    p.add_argument("--final-questions", type=int, default=64, help="questions of the report")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--probe-groups", type=int, default=64, help="mixed groups probed at the end")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--measure-only",
        action="store_true",
        help="measure the model already in --work/model again (same seed, same rollouts) and "
        "update `measured` in --results/report.json; trains nothing",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override of the sft-theorem preset (repeatable)",
    )
    return p.parse_args()


def _relative(value: Any) -> Any:
    """A path argument relative to the working directory (the command as a reader reruns it)."""
    if isinstance(value, str) and Path(value).is_absolute():
        return os.path.relpath(value)
    return value


def _command_args(args: argparse.Namespace) -> str:
    """The arguments as a reader reruns them (a repeated option once per value)."""
    parts = []
    for key, value in vars(args).items():
        flag = f"--{key.replace('_', '-')}"
        if value is None or value is False:
            continue  # the default
        if value is True:
            parts.append(flag)
            continue
        for one in value if isinstance(value, list) else [value]:
            parts.append(f"{flag} {_relative(one)}")
    return " ".join(parts)


def rollout_config(cfg: Any, group_size: int, temperature: float = 1.0) -> RolloutConfig:
    """How a warm start on this world is sampled for its measurements (the SmolLM2 probe too)."""
    return RolloutConfig(
        group_size=group_size,
        max_turns=cfg.eval_max_turns,
        max_turn_tokens=96,
        max_obs_tokens=cfg.max_obs_tokens,
        max_total_tokens=1536,
        topk=cfg.topk,
        temperature=temperature,
    )


def main() -> None:
    args = _args()
    started = time.perf_counter()
    work, results = Path(args.work), Path(args.results)
    if args.measure_only:
        remeasure(args, work, results)
        return
    world = generate_world(WorldConfig.preset("theorem"))
    write_world(world, work / "world")
    cfg = load_sft_config("sft-theorem", [f"out={work}", f"seed={args.seed}", *args.set])
    torch.set_num_threads(cfg.threads or 1)
    model, tok = tiny_model_and_tokenizer(cfg, str(work / "world" / "corpus.jsonl"), world.train)
    retriever = build_retriever(world.corpus, show_progress=False)
    episodes, stats = build_expert_episodes(
        world.train,
        retriever,
        tok,
        topk=cfg.topk,
        max_obs_tokens=cfg.max_obs_tokens,
        think=cfg.think,
        think_bank=cfg.think_bank,
        think_draws=cfg.think_draws,
        seed=cfg.seed,
    )
    by_id = {ex.id: ex for ex in world.train}
    # what a perfect imitator of the expert would still be uncertain about, per action token
    expert_entropy = sum(
        think_entropy(by_id[e.example_id], cfg.think_bank) for e in episodes
    ) / sum(e.num_action_tokens for e in episodes)
    rollout = rollout_config(cfg, args.group_size, args.temperature)
    max_steps = args.max_steps or cfg.steps
    checks: list[dict[str, Any]] = []
    done, stopped = 0, False
    while done < max_steps and not stopped:
        segment = min(args.check_every, max_steps - done)
        sft_train(
            model,
            tok,
            episodes,
            lr=cfg.lr,
            steps=segment,
            batch_size=cfg.batch_size,
            warmup=cfg.warmup if done == 0 else 0,
            seed=cfg.seed * 1000 + len(checks),
            progress=False,
            save=False,
            loss_on=cfg.loss_on,
        )
        done += segment
        check = measure_warm_start(
            model, tok, retriever, world.train[: args.check_questions], rollout, probe_groups=0
        )
        row = {"step": done, "accuracy": check.accuracy, "entropy": check.entropy_per_token}
        checks.append(row)
        print(json.dumps(row), flush=True)
        stopped = check.meets_conditions
    save_tiny(model, tok, work / "model")
    final = measure_warm_start(
        model,
        tok,
        retriever,
        world.train[: args.final_questions],
        rollout,
        seed=args.seed + 1,
        probe_groups=args.probe_groups,
    )
    report = {
        "command": "python experiments/theorem_world/warm_start.py " + _command_args(args),
        "machine": {"cpu": cpu_name(), "threads": cfg.threads, "line": machine()},
        # the model's fingerprint: a rebuild is the same warm start exactly when this matches
        "model_sha256": file_sha256(work / "model" / "model.safetensors"),
        "world": world.config.to_dict(),
        "sft": {
            k: getattr(cfg, k)
            for k in ("lr", "batch_size", "hidden", "layers", "heads", "think_bank", "think_draws")
        },
        "trajectories": stats.to_dict(),
        "expert_entropy_per_action_token": expert_entropy,
        "steps": done,
        "stopped_on_conditions": stopped,
        "checks": checks,
        "measured": final.to_dict(),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    results.mkdir(parents=True, exist_ok=True)
    _write(results, report, final)


def _write(results: Path, report: dict[str, Any], final: Any) -> None:
    write_json(results / "report.json", json.loads(json.dumps(report, default=str)))
    head = (
        f"# Theorem-world warm start\n\n{report['steps']} SFT steps; conditions met: "
        f"{report['stopped_on_conditions']}; {final.questions} training questions x "
        f"{final.group_size} samples at T = {final.temperature}.\n\n"
    )
    (results / "warm_start.md").write_text(head + markdown_table(final), encoding="utf-8")
    print(markdown_table(final))


def remeasure(args: argparse.Namespace, work: Path, results: Path) -> None:
    """The final measurement again, on the saved model, into the existing report (for
    measurements added after the warm start was trained; the others must come out the same)."""
    from llds.models.hf import load_policy

    report = json.loads((results / "report.json").read_text(encoding="utf-8"))
    cfg = load_sft_config("sft-theorem", [f"out={work}", f"seed={args.seed}", *args.set])
    torch.set_num_threads(cfg.threads or 1)
    world = generate_world(WorldConfig.preset("theorem"))
    model, tok = load_policy(work / "model")
    retriever = build_retriever(world.corpus, show_progress=False)
    final = measure_warm_start(
        model,
        tok,
        retriever,
        world.train[: args.final_questions],
        rollout_config(cfg, args.group_size, args.temperature),
        seed=args.seed + 1,
        probe_groups=args.probe_groups,
    )
    before, after = report["measured"], json.loads(json.dumps(final.to_dict(), default=str))
    changed = sorted(k for k in before if k in after and before[k] != after[k])
    report["measured"] = after
    report["remeasured"] = {
        "command": "python experiments/theorem_world/warm_start.py " + _command_args(args),
        "added": sorted(set(after) - set(before)),
        "changed": changed,
    }
    print(json.dumps(report["remeasured"]), flush=True)
    _write(results, report, final)


if __name__ == "__main__":
    main()
