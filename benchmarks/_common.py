"""Helpers shared by the benchmark scripts: machine description and timing."""

from __future__ import annotations

import gzip
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path


def machine() -> str:
    """One line naming the CPU/GPU, core count, torch's CPU kernel set (its figures depend on it)
    and library versions the numbers were taken on."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    threads = torch.get_num_threads()
    kernels = torch.backends.cpu.get_cpu_capability()
    return (
        f"{cpu}, {os.cpu_count()} cores ({threads} torch threads, {kernels} CPU kernels), {dev}, "
        f"torch {torch.__version__}, Python {platform.python_version()}"
    )


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Median wall time of `fn()` in seconds over `repeats` runs after `warmup` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


SINGLE_TURN_TEMPLATE = "Question: {question}\nAnswer: "


def world_tokenizer(world, vocab_size: int = 2000):
    """A BPE tokenizer fitted to an organism world's passages and training questions."""
    from llds.models.bpe import tokenizer_for_world

    return tokenizer_for_world(world, vocab_size)


def single_turn_config(
    run_dir: str, *, prompts: int, group: int, tokens: int, algo, optim, dtype: str = "float32"
):
    """A validated TrainConfig for a timing benchmark: in-memory model and questions, one turn
    of exactly `tokens` generated tokens per completion (no retrieval), no logging, no
    diagnostics, no checkpoints."""
    from llds.rollout import RolloutConfig
    from llds.train.config import (
        DataConfig,
        DiagnosticsConfig,
        LoggingConfig,
        ModelConfig,
        TrainConfig,
    )

    cfg = TrainConfig(
        run_dir=run_dir,
        seed=0,
        steps=10**9,
        save_every=10**9,
        prompts_per_step=prompts,
        model=ModelConfig(path="in-memory", chat=False, dtype=dtype),
        data=DataConfig(train="in-memory", prompt_template=SINGLE_TURN_TEMPLATE),
        rollout=RolloutConfig(
            group_size=group,
            max_turns=0,
            max_turn_tokens=tokens,
            min_turn_tokens=tokens,
            max_total_tokens=4096,
            temperature=1.0,
            max_rows=prompts * group,
        ),
        algo=algo,
        optim=optim,
        logging=LoggingConfig(tensorboard=False, wandb=False, progress=False),
        diagnostics=DiagnosticsConfig(enabled=False),
    )
    cfg.validate()
    return cfg


def finished(cfg) -> bool:
    """Whether the training run of `cfg` (a `TrainConfig`) has logged its last step."""
    from llds.runs.tracking import read_metrics

    rows = read_metrics(cfg.run_dir)  # [] when the run has not started
    return bool(rows) and rows[-1]["step"] >= cfg.steps


def run_unfinished(configs, parallel: int, poll_s: float = 5.0) -> None:
    """Every run of `configs` that has not finished, each in its own process (resuming from its
    last checkpoint), `parallel` at a time; logs go to RUN/train-TIMESTAMP.log."""
    from pathlib import Path

    from llds.train.background import run_queue

    stamp = int(time.time())
    jobs = [(c, Path(c.run_dir) / f"train-{stamp}.log") for c in configs if not finished(c)]
    run_queue(jobs, parallel, poll_s=poll_s)


def read_committed_metrics(path: Path) -> list[dict]:
    """The rows of a committed run log (`metrics.jsonl.gz`, as the study results keep them)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
