"""The theorem-world study's whole GRPO step under two settings: by default the eager decode
loop against the static-cache loop.

Runs `--steps` steps of `experiments/theorem_world/base.yaml` (40 questions x 8 rollouts, up to
5 turns, 10 mini-batches, the study's diagnostics) from the given warm start, once per arm (by
default `rollout.cache=dynamic` and `rollout.cache=static`; `--arms A B` names two others, each
its config overrides separated by spaces), alternating the two runs step by step. Both arms
must do equal work: both loops sample the same tokens, and a performance setting such as
`optim.micro_batch_tokens` changes only float rounding, so both runs train on the same rollouts
(the first step token for token; later steps start from weights that differ in float rounding,
so the script stops if their mean response lengths differ by more than 2%). Reports the median
over steps 2.. (step 1 is the warm-up) of each phase the trainer times (`time/*`).

    python benchmarks/theorem_step.py --model runs/theorem_world/model [--steps 4]
    python benchmarks/theorem_step.py --model ... --arms optim.micro_batch_tokens=16384 \
        optim.micro_batch_tokens=4096
    python benchmarks/theorem_step.py --model ... --profile

`--profile` profiles one more step of the second arm (`torch.profiler`, CPU; profiling the
eager loop's step needed more than 20 GB here) and splits each phase's time into
matrix-product kernels (dense layers and attention: the step's arithmetic) and the
rest (`llds.train.phase_profile`), with the rate the products reach against this core's rate on
a large product. The second arm's matrix-product seconds bound how fast its step could get
without changing what it computes: the first arm's step over them is the largest speed-up left.

The warm start comes from `python experiments/theorem_world/warm_start.py --work
runs/theorem_world`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, median_time
from llds.data.world import WorldConfig, generate_world, write_world
from llds.retrieval.factory import build_retriever
from llds.train.config import load_config
from llds.train.phase_profile import split_by_phase
from llds.train.trainer import GRPOTrainer

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "experiments" / "theorem_world" / "base.yaml"
PHASES = ("rollout", "old_logprob", "ref_logprob", "update", "diagnostics", "step")
ARMS = ("rollout.cache=dynamic", "rollout.cache=static")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the theorem world's warm start")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--lr", type=float, default=None, help="default: the study's calibrated rate")
    ap.add_argument(
        "--arms", nargs=2, default=list(ARMS), help="two arms, each its overrides (space-separated)"
    )
    ap.add_argument(
        "--profile", action="store_true", help="profile one step of the second arm: its arithmetic"
    )
    args = ap.parse_args()
    arms = tuple(args.arms)
    if args.lr is None:
        calibration = ROOT / "experiments" / "theorem_world" / "results" / "calibration.json"
        args.lr = json.loads(calibration.read_text(encoding="utf-8"))["chosen"]
    torch.set_num_threads(1)
    world = generate_world(WorldConfig.preset("theorem"))
    retriever = build_retriever(world.corpus, show_progress=False)
    rows: dict[str, list[dict]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_world(world, work / "world")
        trainers = {
            arm: GRPOTrainer(
                load_config(
                    CONFIG,
                    [
                        f"run_dir={work / str(i)}",
                        f"model.path={args.model}",
                        f"optim.lr={args.lr}",
                        f"data.train={work / 'world' / 'train.jsonl'}",
                        f"data.eval={work / 'world' / 'test.jsonl'}",
                        f"retriever.source={work / 'world' / 'corpus.jsonl'}",
                        *arm.split(),
                        "eval_every=0",
                        "logging.progress=false",
                    ],
                ),
                retriever=retriever,
                resume=False,
            )
            for i, arm in enumerate(arms)
        }
        for step in range(args.steps):
            for arm in arms if step % 2 == 0 else arms[::-1]:
                rows[arm].append(trainers[arm].train_step())
            a, b = (rows[arm][-1] for arm in arms)
            # the first step's rollouts are token-identical; later ones start from weights that
            # differ in float rounding (pi_old agrees to ~1e-6), so a sampled token may flip
            tokens = [r["rollout/response_tokens"] for r in (a, b)]
            if abs(tokens[0] - tokens[1]) > 0.02 * max(tokens):
                sys.exit(f"step {step + 1}: response lengths {tokens} differ: not equal work")
            print(
                f"step {step + 1}: "
                + ", ".join(f"{arm} {rows[arm][-1]['time/step']:.1f} s" for arm in arms)
                + f"; reward {a['reward/mean']:.3f} / {b['reward/mean']:.3f}, "
                f"{tokens[0]:.1f} / {tokens[1]:.1f} model tokens per response",
                flush=True,
            )
        profiled = _profile_step(trainers[arms[1]]) if args.profile else None

    print(f"\nmachine: {machine()}; torch threads 1")
    print(f"command: `python benchmarks/theorem_step.py {shlex.join(sys.argv[1:])}`")
    print(f"learning rate {args.lr:g}; median over steps 2-{args.steps} (step 1 is the warm-up)\n")
    print(f"| phase | {arms[0]} | {arms[1]} | speed-up |")
    print("|---|---|---|---|")
    for phase in PHASES:
        med = [statistics.median(r[f"time/{phase}"] for r in rows[arm][1:]) for arm in arms]
        ratio = med[0] / med[1] if med[1] > 0 else float("nan")
        print(f"| {phase} | {med[0]:.2f} s | {med[1]:.2f} s | {ratio:.2f}x |")
    if profiled is not None:
        step_a = statistics.median(r["time/step"] for r in rows[arms[0]][1:])
        _print_profile(profiled, arms, step_a)


def _profile_step(trainer: GRPOTrainer) -> dict:
    """One more step under the profiler: its phases split into matrix products and the rest."""
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        row = trainer.train_step()
    return {"split": split_by_phase(prof.events()), "step": row["time/step"]}


def _core_gflops(n: int = 1024, repeats: int = 5) -> float:
    """This core's float32 matrix-product rate on one large square product (GFLOP/s)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / median_time(lambda: a @ b, repeats) / 1e9


def _print_profile(profiled: dict, arms: tuple[str, ...], step_a: float) -> None:
    peak = _core_gflops()
    split = profiled["split"]
    print(f"\none more step of {arms[1]}, profiled (the profiler adds about 5-10%);")
    print(f"this core's float32 rate on a 1024x1024x1024 product: {peak:.0f} GFLOP/s\n")
    print(
        "| phase | time | in matrix products | share | of which attention kernels | "
        "rate of the dense products | rest |"
    )
    print("|---|---|---|---|---|---|---|")
    for phase in (*PHASES[:-1], "other"):
        if phase not in split:
            continue
        p = split[phase]
        share = p.matrix_seconds / p.seconds if p.seconds else float("nan")
        print(
            f"| {phase} | {p.seconds:.2f} s | {p.matrix_seconds:.2f} s | {share:.0%} | "
            f"{p.matrix_seconds - p.dense_seconds:.2f} s | {p.dense_gflops:.0f} GFLOP/s | "
            f"{p.other_seconds:.2f} s |"
        )
    floor = sum(p.matrix_seconds for p in split.values())
    attention = floor - sum(p.dense_seconds for p in split.values())
    step = profiled["step"]
    print(f"| step | {step:.2f} s | {floor:.2f} s | {floor / step:.0%} | {attention:.2f} s | | |")
    print(
        f"\nif only its matrix products took time, the step would take {floor:.2f} s: "
        f"{arms[0]}'s median step ({step_a:.2f} s) over that is {step_a / floor:.2f}x, the "
        "largest speed-up left without less arithmetic"
    )


if __name__ == "__main__":
    main()
