"""SmolLM2-135M on the theorem world: a short warm start with thinking text, then the Eq. 3
first-order probe on groups of 16 until 64 high-accuracy groups are in hand (issue item 6).

Does a pretrained LM, warm-started as the theorem asks (thinking text from the paraphrase bank,
loss on actions only, so retrieved passages stay out of its distribution), have correct
responses that gradient descent on their own group drags down? The script

1. makes the `world-theorem` world and its BM25 retriever;
2. fine-tunes SmolLM2-135M-Instruct on the expert trajectories (`sft-theorem`'s thinking text,
   loss on actions) in segments of `--check-every` steps, sampling `--check-questions` training
   questions x 8 at T = 1 after each; it stops at the first check with sampled accuracy >= 0.5
   and entropy >= 0.3 nats per model token (`warm_start_report.py`), at `--max-sft-steps`,
   or when `--budget-s` says the rest of the time belongs to the probe;
3. samples groups of `--group-size` on the training questions in order, 8 questions at a time,
   until `--high-groups` groups with more than half and less than all of their responses
   correct have been sampled (or `--max-questions`), and measures them all
   (`measure_batches`, every mixed group probed): the share of correct responses whose
   first-order likelihood change under their group's GRPO loss is negative (drag > pull),
   pooled over responses, by number of correct responses in the group.

Everything lands in `--out` (`smollm2_probe.json`, rewritten after every stage, and
`smollm2_probe.md`). `--smoke` swaps SmolLM2 for the tiny random model of `sft-theorem`,
shrinks every count and marks every other response of the probed groups correct (a random model
answers none right, and the probe runs on mixed groups only): it checks that the whole path runs
(on a GPU too) in a minute, and measures nothing.

    python experiments/theorem_world/smollm2_probe.py --out runs/smollm2_theorem --device cuda
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: the studies' modules
from llds.data.world import WorldConfig, generate_world, write_world
from llds.io import write_json
from llds.retrieval.factory import build_retriever
from llds.rollout import RolloutBatch
from llds.sft import tiny_model_and_tokenizer
from llds.sft.config import load_sft_config
from llds.sft.data import build_expert_episodes
from llds.sft.trainer import sft_train
from theorem_world.warm_start_report import (
    markdown_table,
    measure_batches,
    sample_groups,
    until_enough,
)
from warm_start import rollout_config


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="results folder")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--gguf", default=None, help="a SmolLM2 GGUF file (default: the package's)")
    p.add_argument("--cache", default=None, help="converted-model folder (default: llds cache)")
    p.add_argument("--sft-lr", type=float, default=5e-5)
    p.add_argument("--sft-batch", type=int, default=16)
    p.add_argument("--think-draws", type=int, default=4, help="thinking texts per question")
    p.add_argument("--check-every", type=int, default=50)
    p.add_argument("--check-questions", type=int, default=32)
    p.add_argument("--max-sft-steps", type=int, default=600)
    p.add_argument("--group-size", type=int, default=16)
    p.add_argument("--high-groups", type=int, default=64)
    p.add_argument("--max-questions", type=int, default=320)
    p.add_argument("--budget-s", type=float, default=420.0, help="wall seconds for it all")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="tiny random model, tiny counts")
    return p.parse_args()


def _smoke_rewards(batches: Iterator[RolloutBatch]) -> Iterator[RolloutBatch]:
    """`--smoke` only: every other response marked correct, so the probe path runs."""
    for batch in batches:
        batch.rewards[::2] = 1.0
        yield batch


def main() -> None:
    args = _args()
    started = time.perf_counter()
    if args.smoke:
        args.check_every, args.max_sft_steps, args.check_questions = 2, 4, 2
        args.high_groups, args.max_questions, args.group_size = 2, 4, 4
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "command": "python experiments/theorem_world/smollm2_probe.py "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v),
        "machine": {
            "device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu",
            "cpu": platform.processor() or platform.machine(),
            "torch": torch.__version__,
        },
    }

    def save(stage: str) -> None:
        report["stage"] = stage
        report["wall_s"] = round(time.perf_counter() - started, 1)
        write_json(out / "smollm2_probe.json", json.loads(json.dumps(report, default=str)))
        print(f"[{report['wall_s']:7.1f} s] {stage}", flush=True)

    torch.manual_seed(args.seed)
    world = generate_world(WorldConfig.preset("theorem"))
    write_world(world, out / "world")
    cfg = load_sft_config(
        "sft-theorem", [f"out={out}", f"seed={args.seed}", f"think_draws={args.think_draws}"]
    )
    if args.smoke:
        model, tok = tiny_model_and_tokenizer(cfg, str(out / "world" / "corpus.jsonl"), world.train)
        model = model.to(args.device)
    else:
        from llds.models import load_smollm2

        model, tok = load_smollm2(args.cache, device=args.device, gguf=args.gguf)
    report["parameters"] = sum(p.numel() for p in model.parameters())
    retriever = build_retriever(world.corpus, show_progress=False)
    episodes, stats = build_expert_episodes(
        world.train,
        retriever,
        tok,
        topk=cfg.topk,
        max_obs_tokens=cfg.max_obs_tokens,
        think=True,
        think_bank=cfg.think_bank,
        think_draws=cfg.think_draws,
        seed=args.seed,
    )
    report["trajectories"] = {
        **stats.to_dict(),
        "episodes": len(episodes),
        "mean_tokens": sum(len(e) for e in episodes) / max(len(episodes), 1),
        "action_tokens_per_episode": sum(e.num_action_tokens for e in episodes)
        / max(len(episodes), 1),
    }
    report["sft"] = {"lr": args.sft_lr, "batch_size": args.sft_batch, "loss_on": "actions"}
    report["checks"] = []
    save("warm start: trajectories built")

    check_rollout = rollout_config(cfg, 8)
    sft_deadline = started + 0.55 * args.budget_s
    done, met = 0, False
    while done < args.max_sft_steps and not met and time.perf_counter() < sft_deadline:
        segment = min(args.check_every, args.max_sft_steps - done)
        result = sft_train(
            model,
            tok,
            episodes,
            lr=args.sft_lr,
            steps=segment,
            batch_size=args.sft_batch,
            warmup=10 if done == 0 else 0,
            seed=args.seed * 1000 + len(report["checks"]),
            progress=False,
            save=False,
            loss_on="actions",
        )
        done += segment
        # 16 questions x 8 per sampled chunk: on a GPU a decode step costs about the same for
        # 128 rows as for 64, and the logits of the scored tokens still fit
        chunks = sample_groups(
            model, tok, retriever, world.train[: args.check_questions], check_rollout,
            questions_per_chunk=16,
        )  # fmt: skip
        check = measure_batches(model, chunks, 1.0, probe_groups=0)
        met = check.meets_conditions
        report["checks"].append(
            {
                "step": done,
                "loss": result.final_loss,
                "accuracy": check.accuracy,
                "entropy": check.entropy_per_token,
                "meets_conditions": met,
            }
        )
        save(f"warm start: check at step {done}")
    report["sft"]["steps"] = done
    report["sft"]["stopped_on_conditions"] = met

    deadline = started + 0.9 * args.budget_s
    seen = {"chunks": 0, "high_mixed": 0}
    batches = sample_groups(
        model,
        tok,
        retriever,
        world.train[: args.max_questions],
        rollout_config(cfg, args.group_size),
        seed=args.seed + 1,
        questions_per_chunk=8,
    )
    if args.smoke:
        batches = _smoke_rewards(batches)
    final = measure_batches(
        model, until_enough(batches, args.high_groups, deadline, seen), 1.0, probe_groups=None
    )
    report["sampled"] = seen
    report["measured"] = final.to_dict()
    save("probe: done")
    head = (
        f"# SmolLM2-135M on the theorem world: warm start and first-order probe\n\n"
        f"{done} SFT steps (conditions met: {met}); {final.questions} training questions x "
        f"{final.group_size} samples at T = 1; every mixed group probed.\n\n"
    )
    (out / "smollm2_probe.md").write_text(head + markdown_table(final), encoding="utf-8")
    print(markdown_table(final), flush=True)


if __name__ == "__main__":
    main()
