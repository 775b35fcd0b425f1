"""The SmolLM2-wiki GRPO step as the trainer runs it: full fine-tuning in float32 (the
`smollm2-wiki-rl` preset) against LoRA with bf16 compute (`smollm2-wiki-lora`) and the two
sampling settings the LoRA preset could add, and the state each arm's checkpoint writes.

Every arm starts from the same warm start (the presets' `model.path`, which
`experiments/smollm2_wiki/warm_start.py` writes) with the same seed, data and retriever, and
all arms run in one process, alternating step by step (the arm that goes first rotates), so a
background job slows them alike. Reports the median over steps 2.. (step 1 is the warm-up) of
each phase the trainer times, the sampler-vs-trained mismatch where the arm samples from a copy,
and the size of the checkpoint each arm writes after its last step. Arms:

- `full, fp32`: `smollm2-wiki-rl` (the comparison: full fine-tuning, float32 everywhere);
- `LoRA, bf16`: `smollm2-wiki-lora` as committed (rank 16 on every linear layer, bf16 compute
  where the CPU has bf16 instructions; rollouts sampled from the policy itself);
- `LoRA, bf16, bf16 copy`: the same, sampling from a bf16 copy with llds's grouped-query
  attention (`rollout.dtype=bfloat16 rollout.attn_implementation=llds_grouped`);
- `LoRA, bf16, prefix sharing`: the same as `LoRA, bf16` with each group's prompt computed once
  in every pass (`rollout.prefix_sharing=true`).

    python benchmarks/smollm2_lora_step.py [--steps 3] [--arms full lora copy shared]
        [--threads 2] [--work DIR] [--json PATH]

Needs the optional packages of the README (SmolLM2, Red-Trivia, Wikipedia summaries) and the
warm start; the last line is `LoRA step speedup: X.XXx` (the fastest LoRA arm against `full`).
`--json PATH` also writes the measurement as data: the machine, the command and, for each arm
in order, its preset, its overrides of that preset, the median of each phase, the median
mismatch and the checkpoint's size. The LoRA study's decision 1 is read from it
(`experiments/smollm2_wiki_lora/run.py --decide-sampling PATH`: the LoRA arm with the shortest
median step).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine
from llds.io import write_json
from llds.train.config import load_config
from llds.train.trainer import GRPOTrainer

ARMS = {
    "full": ("full, fp32", "smollm2-wiki-rl", ()),
    "lora": ("LoRA, bf16", "smollm2-wiki-lora", ()),
    "copy": (
        "LoRA, bf16, bf16 copy",
        "smollm2-wiki-lora",
        ("rollout.dtype=bfloat16", "rollout.attn_implementation=llds_grouped"),
    ),
    "shared": ("LoRA, bf16, prefix sharing", "smollm2-wiki-lora", ("rollout.prefix_sharing=true",)),
}
PHASES = ("rollout", "old_logprob", "ref_logprob", "update", "diagnostics", "step")
MISMATCH = "mismatch/k3_kl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3, help="steps per arm (the first is warm-up)")
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    ap.add_argument("--threads", type=int, default=2, help="torch threads (all arms alike)")
    ap.add_argument("--work", type=Path, default=None, help="run folders (default: a temp dir)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    if args.steps < 2:
        sys.exit("--steps: at least 2 (a warm-up and a measured step)")
    torch.set_num_threads(args.threads)
    arms = list(dict.fromkeys(args.arms))
    rows: dict[str, list[dict]] = {arm: [] for arm in arms}
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        trainers = {arm: _trainer(work / arm, arm) for arm in arms}
        for step in range(args.steps):
            order = arms[step % len(arms) :] + arms[: step % len(arms)]
            for arm in order:
                rows[arm].append(trainers[arm].train_step())
            print(
                f"step {step + 1}: "
                + ", ".join(f"{arm} {rows[arm][-1]['time/step']:.1f} s" for arm in arms),
                flush=True,
            )
        for arm, trainer in trainers.items():
            saved = trainer.save()
            sizes[arm] = sum(p.stat().st_size for p in saved.rglob("*") if p.is_file())
    med = {
        arm: {p: statistics.median(r.get(f"time/{p}", 0.0) for r in rows[arm][1:]) for p in PHASES}
        for arm in arms
    }
    command = f"python benchmarks/smollm2_lora_step.py {shlex.join(sys.argv[1:])}"
    print(f"\nmachine: {machine()}; torch threads {args.threads}")
    print(f"command: `{command}`")
    print(
        "arms alternated step by step in one process, the same warm start, seed and data; "
        f"median over steps 2-{args.steps} (step 1 is the warm-up)\n"
    )
    names = [ARMS[a][0] for a in arms]
    print("| phase | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(arms))
    for p in PHASES:
        print(f"| {p} | " + " | ".join(f"{med[a][p]:.1f} s" for a in arms) + " |")
    mismatch = [_median_of(rows[a][1:], MISMATCH) for a in arms]
    print("| mismatch k3 KL | " + " | ".join(_num(m) for m in mismatch) + " |")
    print("| checkpoint | " + " | ".join(f"{sizes[a] / 2**20:.1f} MiB" for a in arms) + " |")
    if args.json is not None:
        write_json(args.json, _record(args, command, arms, med, mismatch, sizes))
        print(f"figures written to {args.json}")
    lora = [a for a in arms if a != "full"]
    if "full" in arms and lora:
        best = min(lora, key=lambda a: med[a]["step"])
        print()
        for a in lora:
            print(f"{ARMS[a][0]}: step {_ratio(med['full']['step'], med[a]['step']):.2f}x full's")
        print(f"LoRA step speedup: {_ratio(med['full']['step'], med[best]['step']):.2f}x")


def _record(
    args: argparse.Namespace,
    command: str,
    arms: list[str],
    med: dict[str, dict[str, float]],
    mismatch: list[float | None],
    sizes: dict[str, int],
) -> dict:
    """What `--json` writes: enough for a reader to rebuild the table and for the LoRA study
    to take its decision 1 from it without parsing the printed text."""
    return {
        "benchmark": "benchmarks/smollm2_lora_step.py",
        "machine": machine(),
        "threads": args.threads,
        "command": command,
        "steps": args.steps,
        "measured_steps": list(range(2, args.steps + 1)),
        "arms": [
            {
                "arm": arm,
                "name": ARMS[arm][0],
                "preset": ARMS[arm][1],
                "overrides": list(ARMS[arm][2]),
                "median_s": med[arm],
                "mismatch_k3_kl": mismatch[i],
                "checkpoint_bytes": sizes[arm],
            }
            for i, arm in enumerate(arms)
        ],
    }


def _trainer(run_dir: Path, arm: str) -> GRPOTrainer:
    _, preset, extra = ARMS[arm]
    cfg = load_config(
        preset,
        [f"run_dir={run_dir}", *extra, "eval_every=0", "logging.progress=false", "save_every=1000"],
    )
    return GRPOTrainer(cfg, resume=False)


def _median_of(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if isinstance(r.get(key), int | float)]
    return statistics.median(values) if values else None


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2e}"


def _ratio(before: float, after: float) -> float:
    return before / after if after > 0 else float("nan")


if __name__ == "__main__":
    main()
