"""The theorem study's GRPO step with each group's prompt computed once
(`rollout.prefix_sharing`) against the same step without (the default path before it, with
its chunks of 64 rollouts): the no-grad log-prob passes and the update's micro-batches (tails
cut where padding costs more than a call), and the rollout's chunks sized by the cache budget
(`rollout.cache_memory_mb`).

Both arms start from the committed warm start `experiments/theorem_world/results/warm_start_3/`
(unpacked to a temporary folder) with the study's recipe (`experiments/theorem_world/base.yaml`,
its calibrated learning rate, and the micro-batch budgets its confirmation runs with:
`optim.micro_batch_tokens=4096`, `optim.logprob_micro_batch_tokens=16384`), the same seeds,
one torch thread, and run in one process, alternating step by step (the arm that goes first
alternates too), so that a background job on the machine slows both alike. Reports the median
over steps 2.. (step 1 is the warm-up) of each phase the trainer times, whether every step's
rollouts were token-identical between the arms, and their rewards, entropies and KL terms
side by side.

    python benchmarks/prefix_sharing.py [--steps 4] [--arms "A" "B"]

The last three lines are `rollout speedup: X.XXx`, `step speedup: X.XXx` and
`identical: yes|no` (yes: every step's rollouts token for token the same in both arms).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tarfile
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine
from llds.data.world import WorldConfig, generate_world, write_world
from llds.retrieval.factory import build_retriever
from llds.train.config import load_config
from llds.train.trainer import GRPOTrainer

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "experiments" / "theorem_world"
CONFIG = STUDY / "base.yaml"
WARM_START = STUDY / "results" / "warm_start_3" / "model.tar.gz"
BUDGETS = ("optim.micro_batch_tokens=4096", "optim.logprob_micro_batch_tokens=16384")
ARMS = ("rollout.prefix_sharing=false rollout.max_rows=64", "rollout.prefix_sharing=true")
"""the default path before prefix sharing (chunks of 64 rollouts), and prefix sharing with
the defaults (chunks as the cache budget allows: the study's 320 rollouts in one)"""
PHASES = ("rollout", "old_logprob", "ref_logprob", "update", "diagnostics", "step")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4, help="steps per arm (the first is warm-up)")
    ap.add_argument(
        "--arms", nargs=2, default=list(ARMS), help="two arms, each its overrides (space-separated)"
    )
    args = ap.parse_args()
    if args.steps < 4:
        sys.exit("--steps: at least 4 (a warm-up and the median of 3)")
    lr = json.loads((STUDY / "results" / "calibration.json").read_text(encoding="utf-8"))["chosen"]
    torch.set_num_threads(1)
    arms = tuple(args.arms)
    world = generate_world(WorldConfig.preset("theorem"))
    retriever = build_retriever(world.corpus, show_progress=False)
    rows: dict[str, list[dict]] = {arm: [] for arm in arms}
    rollouts: dict[str, list[list]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        with tarfile.open(WARM_START) as archive:
            archive.extractall(work / "model", filter="data")
        write_world(world, work / "world")
        trainers = {
            arm: _trainer(work, i, arm, lr, retriever, rollouts[arm]) for i, arm in enumerate(arms)
        }
        for step in range(args.steps):
            for arm in arms if step % 2 == 0 else arms[::-1]:
                rows[arm].append(trainers[arm].train_step())
            a, b = (rows[arm][-1] for arm in arms)
            same = rollouts[arms[0]][-1] == rollouts[arms[1]][-1]
            print(
                f"step {step + 1}: "
                + ", ".join(f"{arm} {rows[arm][-1]['time/step']:.2f} s" for arm in arms)
                + f"; rollouts {'identical' if same else 'DIFFER'}, reward {a['reward/mean']:.4f}"
                f" / {b['reward/mean']:.4f}, entropy {a['policy/entropy']:.6f} / "
                f"{b['policy/entropy']:.6f}, kl {a['policy/kl']:.3e} / {b['policy/kl']:.3e}",
                flush=True,
            )
    identical = all(x == y for x, y in zip(*(rollouts[arm] for arm in arms), strict=True))
    med = {
        phase: [statistics.median(r[f"time/{phase}"] for r in rows[arm][1:]) for arm in arms]
        for phase in PHASES
    }
    print(f"\nmachine: {machine()}; torch threads 1")
    print(f"command: `python benchmarks/prefix_sharing.py {shlex.join(sys.argv[1:])}`")
    print(
        f"learning rate {lr:g}, {' '.join(BUDGETS)}; arms alternated step by step in one "
        f"process; median over steps 2-{args.steps} (step 1 is the warm-up)\n"
    )
    print(f"| phase | {arms[0]} | {arms[1]} | speed-up |")
    print("|---|---|---|---|")
    for phase, (x, y) in med.items():
        print(f"| {phase} | {x:.2f} s | {y:.2f} s | {_ratio(x, y):.2f}x |")
    print()
    print(f"rollout speedup: {_ratio(*med['rollout']):.2f}x")
    print(f"step speedup: {_ratio(*med['step']):.2f}x")
    print(f"identical: {'yes' if identical else 'no'}")


def _trainer(work: Path, i: int, arm: str, lr: float, retriever, record: list) -> GRPOTrainer:
    """One arm's trainer, its rollouts' response ids appended to `record` at every step."""
    cfg = load_config(
        CONFIG,
        [
            f"run_dir={work / str(i)}",
            f"model.path={work / 'model'}",
            f"optim.lr={lr}",
            f"data.train={work / 'world' / 'train.jsonl'}",
            f"data.eval={work / 'world' / 'test.jsonl'}",
            f"retriever.source={work / 'world' / 'corpus.jsonl'}",
            *BUDGETS,
            *arm.split(),
            "eval_every=0",
            "logging.progress=false",
        ],
    )
    trainer = GRPOTrainer(cfg, retriever=retriever, resume=False)
    generate = trainer.engine.generate

    def recorded(requests, **kwargs):
        batch = generate(requests, **kwargs)
        record.append([e.response_ids for e in batch.episodes])
        return batch

    trainer.engine.generate = recorded
    return trainer


def _ratio(before: float, after: float) -> float:
    return before / after if after > 0 else float("nan")


if __name__ == "__main__":
    main()
